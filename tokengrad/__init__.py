"""tokengrad: see which tokens drive each GRPO update.

Public API, loaded lazily (the dashboard and the read side never import torch):

    token_stats, TokenStats, Recorder       # recording (torch)
    logprobs_with_stats                     # log pi with its statistics in one pass (torch)
    load_run, list_runs, SCHEMA_VERSION     # reading (pandas / DuckDB)
    train.run(config, **overrides)          # the built-in trainer (tokengrad.train is its package)

Layers, bottom up: the ground (schema, registry, faults, _version); read/ (pandas, DuckDB), objective/ and
record/ (torch); train/ and integrations/ on those; figures/ on read/; cli/ and app/ on top. The import
rules are one table, tests/import_rules.py, checked by tests/test_layers.py.
"""

from tokengrad._version import __version__ as __version__

# Every public name loads on first use, so that `import tokengrad.record` (torch) never loads the read side
# (pandas, DuckDB) and `import tokengrad.read.runs` never loads torch.
_LAZY = {
    "SCHEMA_VERSION": "schema",
    "load_run": "read.runs",
    "list_runs": "read.runs",
    "token_stats": "record",
    "TokenStats": "record",
    "Recorder": "record",
    "StepRecorder": "record",
    "logprobs_with_stats": "record",
    "attach": "integrations.trl",
    "register_weighting": "objective.weighting",
    "get_weighting": "objective.weighting",
}

__all__ = ["train", *_LAZY]


def __getattr__(name):
    import importlib

    if name == "train":  # the trainer package: tokengrad.train.run(config, **overrides)
        return importlib.import_module(".train", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'tokengrad' has no attribute {name!r}")
