"""The built-in GRPO trainer: the loop (`trainer.py`), its updates (`updates.py`), rollouts, models, config,
checkpoints and tasks; the pure math is in `tokengrad.objective`. Builds on `tokengrad.record`.

    import tokengrad.train
    run_dir = tokengrad.train.run("configs/tiny_charset.toml", steps=20, weighting="tr_grpo")

`tokengrad.train` is this package; `run` is its entry point (`tokengrad.train.trainer.train`). Calling the
package itself, `tokengrad.train(...)`, was the entry point of the first releases: it still runs, with a
FutureWarning naming `tokengrad.train.run`. Submodules load on first use, so `import
tokengrad.objective.weighting` does not pull in transformers.
"""

import importlib
import sys
import types
import warnings

__all__ = ["Trainer", "run"]
_FROM_TRAINER = {"Trainer": "Trainer", "run": "train"}


class _OldEntryPoint(types.ModuleType):
    # A module is not callable; its class may be swapped for one that is (Python >= 3.5). Kept only so that
    # the first releases' `tokengrad.train(config, **overrides)` says what replaced it.
    def __call__(self, *args, **kwargs):
        warnings.warn(
            "tokengrad.train(...) is now tokengrad.train.run(...): tokengrad.train is the trainer package",
            FutureWarning,
            stacklevel=2,
        )
        return importlib.import_module("tokengrad.train.trainer").train(*args, **kwargs)


def __getattr__(name):
    if name in _FROM_TRAINER:
        return getattr(importlib.import_module("tokengrad.train.trainer"), _FROM_TRAINER[name])
    raise AttributeError(f"module 'tokengrad.train' has no attribute {name!r}")


sys.modules[__name__].__class__ = _OldEntryPoint
