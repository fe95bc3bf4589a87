"""The read side: a run directory as pandas frames and DuckDB SQL (`load_run`, `Run`), the one module that
knows the file layout (`layout`), the token-table aggregations (`queries`), shares of tokens, gradient and
update by partition (`share_queries`, `gradient_shares`) and the dashboard's served-root rule
(`served_root`). pandas, pyarrow and DuckDB only: never torch, plotting or training code.

    from tokengrad.read import load_run
    run = load_run("sample_runs/lab_grpo")
"""

import importlib

_LAZY = {"load_run": "runs", "list_runs": "runs", "Run": "runs"}
__all__ = list(_LAZY)


def __getattr__(name):
    # Lazy, so that the writer's use of `tokengrad.read.layout` does not load pandas and DuckDB.
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
