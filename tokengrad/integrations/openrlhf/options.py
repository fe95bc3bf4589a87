"""The plugin's options. OpenRLHF builds its Ray actors itself and never calls tokengrad, so the options reach
every worker as environment variables: the launcher (tokengrad.integrations.openrlhf.launch) passes every
TOKENGRAD_* variable of its own environment to the job's runtime env. The names and their parsing are the
verl plugin's (tokengrad.integrations.host), so one setting means the same in both."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tokengrad.integrations.host import BUDGET_ENV, RUN_DIR_ENV, env_count

DEFAULT_RUN_DIR = os.path.join("tokengrad_runs", "openrlhf")

__all__ = ["BUDGET_ENV", "DEFAULT_RUN_DIR", "RUN_DIR_ENV", "OpenRLHFOptions"]


@dataclass(frozen=True)
class OpenRLHFOptions:
    """run_dir: where every rank writes; token_budget: the Recorder's budget=K (token rows per step and
    rank; None: all)."""

    run_dir: str = DEFAULT_RUN_DIR
    token_budget: int | None = None

    @classmethod
    def from_env(cls) -> "OpenRLHFOptions":
        return cls(run_dir=os.environ.get(RUN_DIR_ENV, DEFAULT_RUN_DIR), token_budget=env_count(BUDGET_ENV))
