"""The built-in GRPO trainer: the loop (`trainer.py`), its updates (`updates.py`), rollouts, models, config,
checkpoints and tasks; the pure math is in `tokengrad.objective`. Builds on `tokengrad.record`.

    import tokengrad.train
    run_dir = tokengrad.train.run("configs/tiny_charset.toml", steps=20, weighting="tr_grpo")

`tokengrad.train` is this package; `run` is its entry point (`tokengrad.train.trainer.train`). Submodules
load on first use (PEP 562 `__getattr__`), so `import tokengrad.objective.weighting` does not pull in
transformers.
"""

import importlib

__all__ = ["Trainer", "run"]
_FROM_TRAINER = {"Trainer": "Trainer", "run": "train"}


def __getattr__(name):
    if name in _FROM_TRAINER:
        return getattr(importlib.import_module("tokengrad.train.trainer"), _FROM_TRAINER[name])
    raise AttributeError(f"module 'tokengrad.train' has no attribute {name!r}")
