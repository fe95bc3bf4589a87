"""tokengrad: see which tokens drive each GRPO update.

Public API (torch-dependent names load lazily, so `tokengrad.runs`, `tokengrad.schema` and the dashboard
never import torch):

    token_stats, TokenStats, Recorder       # recording (torch)
    logprobs_with_stats                     # log pi with its statistics in one pass (torch)
    load_run, list_runs, SCHEMA_VERSION     # reading (pandas / DuckDB)
"""

__version__ = "0.1.0"

from .schema import SCHEMA_VERSION
from .runs import list_runs, load_run

_LAZY = {
    "token_stats": "stats", "TokenStats": "stats", "Recorder": "recorder", "logprobs_with_stats": "selective",
    "train": "trainer", "attach": "integrations.trl",
    "register_weighting": "weighting", "get_weighting": "weighting",
}

__all__ = ["SCHEMA_VERSION", "load_run", "list_runs", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'tokengrad' has no attribute {name!r}")
