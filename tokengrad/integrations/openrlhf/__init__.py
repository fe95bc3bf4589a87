"""OpenRLHF: record the policy actor's updates of `openrlhf.cli.train_ppo_ray` (extra `openrlhf`).

    python -m tokengrad.integrations.openrlhf.launch <train_ppo_ray's arguments>

The launcher (`launch`) starts Ray with `install` as the job's `worker_process_setup_hook` and then runs
OpenRLHF's own command line. `install` (`hooks`) runs in every worker and, in the process that imports
OpenRLHF's actor trainer, wraps its training step and loss (`trainer`); each such process records its
rank into $TOKENGRAD_RUN_DIR (`recording`, `options`). docs/openrlhf.md has the set-up and what is recorded.

Ray imports this package in every worker process, so it loads only the standard library here; the other
names load on first use.
"""

from tokengrad.integrations.openrlhf.hooks import HOOK, TRAINER_MODULE, install, when_imported

_LAZY = {
    "OpenRLHFOptions": "options",
    "DEFAULT_RUN_DIR": "options",
    "RUN_DIR_ENV": "options",
    "BUDGET_ENV": "options",
    "OpenRLHFRecording": "recording",
    "recording": "recording",
    "close_recording": "recording",
    "TESTED_OPENRLHF": "trainer",
    "applied_is_weights": "trainer",
    "check_openrlhf_version": "trainer",
    "wrap_trainer": "trainer",
}

__all__ = ["HOOK", "TRAINER_MODULE", "install", "when_imported", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
