"""The built-in GRPO trainer: the loop (`trainer.py`), its pure math (`loss.py`, `weighting.py`,
`advantages.py`), rollouts, models, config, checkpoints and tasks. Builds on `tokengrad.record`.

    import tokengrad
    run_dir = tokengrad.train("configs/tiny_charset.toml", steps=20, weighting="tr_grpo")

The package itself is callable: `tokengrad.train(...)` has been the public entry point since the first
release, and keeping it while `tokengrad.train` is also this package needs a module whose class defines
`__call__` (a module's `__class__` may be reassigned, Python >= 3.5). Submodules load on first use, so
`import tokengrad.objective.weighting` does not pull in transformers.
"""

import importlib
import sys
import types

__all__ = ["Trainer", "train"]


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        """Same as `tokengrad.train.trainer.train`: build, set up and run a Trainer; returns the run
        directory."""
        return importlib.import_module("tokengrad.train.trainer").train(*args, **kwargs)


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module("tokengrad.train.trainer"), name)
    raise AttributeError(f"module 'tokengrad.train' has no attribute {name!r}")


sys.modules[__name__].__class__ = _CallablePackage
