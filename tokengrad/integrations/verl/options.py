"""The plugin's options. verl builds its workers from its own config and never calls tokengrad, so the
options reach every process (driver and Ray workers) as environment variables, e.g. through
`+ray_kwargs.ray_init.runtime_env.env_vars.TOKENGRAD_...=...` (docs/verl.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tokengrad.integrations.host import BUDGET_ENV, RUN_DIR_ENV, env_count

PROBE_ENV = "TOKENGRAD_MISMATCH_PROBE_EVERY"  # bypass / fully-async: a no-grad forward every N actor updates
DEFAULT_RUN_DIR = os.path.join("tokengrad_runs", "verl")


@dataclass(frozen=True)
class VerlOptions:
    """run_dir: where every rank writes; token_budget: the Recorder's budget=K; mismatch_probe_every: in
    bypass mode, every N-th actor update (`update_actor`: one rollout batch) first runs one no-grad forward
    of the trainer's model on the batch so the gap log pi_old - log mu is recorded (None: never)."""

    run_dir: str = DEFAULT_RUN_DIR
    token_budget: int | None = None
    mismatch_probe_every: int | None = None

    @classmethod
    def from_env(cls) -> "VerlOptions":
        return cls(
            run_dir=os.environ.get(RUN_DIR_ENV, DEFAULT_RUN_DIR),
            token_budget=env_count(BUDGET_ENV),
            mismatch_probe_every=env_count(PROBE_ENV),
        )
