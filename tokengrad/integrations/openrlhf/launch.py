"""A thin launcher for OpenRLHF's PPO/GRPO trainer with tokengrad recording:

    TOKENGRAD_RUN_DIR=/shared/runs/x python -m tokengrad.integrations.openrlhf.launch <train_ppo_ray args>

OpenRLHF loads no plugins, so the recorder reaches its actors through Ray: this starts Ray with tokengrad's
`worker_process_setup_hook` (run in every worker process before any actor code) and every TOKENGRAD_*
variable of this environment, then runs `openrlhf.cli.train_ppo_ray` as `python -m` would, arguments and
all. Its `train(args)` calls `ray.init` only when Ray is not initialised yet, so the Ray started here is the
one it uses; the three variables it would set on its own Ray (openrlhf/cli/train_ppo_ray.py) are set here
with the same defaults. RAY_ADDRESS (or `ray start` on this node) joins an existing cluster as usual.
"""

from __future__ import annotations

import os
import runpy
import sys

from tokengrad.integrations.openrlhf.hooks import HOOK

OPENRLHF_CLI = "openrlhf.cli.train_ppo_ray"
# the environment train_ppo_ray's own ray.init gives the job: the user's value, else OpenRLHF's default
OPENRLHF_ENV_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
}


def runtime_env(environ=None) -> dict:
    """The job's runtime env: the set-up hook and the variables every worker needs."""
    environ = os.environ if environ is None else environ
    env_vars = {k: environ.get(k, v) for k, v in OPENRLHF_ENV_DEFAULTS.items()}
    env_vars.update({k: v for k, v in environ.items() if k.startswith("TOKENGRAD_")})
    return {"worker_process_setup_hook": HOOK, "env_vars": env_vars}


def main(argv: list[str] | None = None) -> None:
    import ray

    if ray.is_initialized():
        raise RuntimeError("Ray is already initialised in this process; start the launcher in a fresh one")
    ray.init(runtime_env=runtime_env())
    sys.argv = [OPENRLHF_CLI, *(sys.argv[1:] if argv is None else argv)]
    runpy.run_module(OPENRLHF_CLI, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
