"""tokengrad: see which tokens drive each GRPO update.

Public API, loaded lazily (the dashboard and the read side never import torch):

    token_stats, TokenStats, Recorder       # recording (torch)
    logprobs_with_stats                     # log pi with its statistics in one pass (torch)
    load_run, list_runs, SCHEMA_VERSION     # reading (pandas / DuckDB)
    train(config, **overrides)              # the built-in trainer (the tokengrad.train package is callable)

Layers, bottom up: schema.py and registry.py; record/ (torch) and the read side (runs.py, queries.py);
train/ and integrations/ on record/; figures/ on the read side; cli.py, dashboard.py and app/ on top.
"""

__version__ = "0.1.0"

# Every public name loads on first use, so that `import tokengrad.record` (torch) never loads the read side
# (pandas, DuckDB) and `import tokengrad.runs` never loads torch.
_LAZY = {
    "SCHEMA_VERSION": "schema", "load_run": "runs", "list_runs": "runs",
    "token_stats": "record", "TokenStats": "record", "Recorder": "record", "StepRecorder": "record",
    "logprobs_with_stats": "record", "attach": "integrations.trl",
    "register_weighting": "train.weighting", "get_weighting": "train.weighting",
}

__all__ = ["train", *_LAZY]


def __getattr__(name):
    import importlib
    if name == "train":  # the trainer package, callable as tokengrad.train(config, **overrides)
        return importlib.import_module(".train", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'tokengrad' has no attribute {name!r}")
