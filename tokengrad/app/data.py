"""Cached data layer of the dashboard: loaders and token queries, no UI calls and no torch.

Every cached function takes a *signature* of the files it reads: a tuple of (relative path, mtime_ns, size)
of meta.json and the table's parquet files. While a run is being written, a new step file, a compaction or
a rewritten meta.json changes the signature, so the next script run misses the cache and reads the new
data; a finished run keeps its signature and is served from the cache. Views call the uncached façade
functions below (`meta`, `table`, `query`, ...), which compute the signature and call the cached loaders.

Token-level data are never loaded whole: `query` runs one of tokengrad.read.queries' DuckDB aggregations.

The cache is bounded in size and time: an entry whose run has a newer signature is dropped as soon as the
new one is loaded (a live refresh keeps one copy of each table, not one per refresh), every entry expires
after _CACHE_TTL_S, and there are at most _CACHE_ENTRIES per loader.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from tokengrad import schema
from tokengrad.read import (
    entropy_law,
    entropy_queries,
    gradient_shares,
    headline,
    layout,
    queries,
    rollout_queries,
    share_queries,
    token_shares,
)
from tokengrad.read import status as run_state
from tokengrad.read.remote import RemoteError, local_copy
from tokengrad.read.runs import Run, load_run
from tokengrad.read.served_root import runs_below
from tokengrad.read.unreadable import run_losses

Signature = tuple[tuple[str, int, int], ...]
SMALL_TABLES = ("steps", "layers", "buckets", "samples", "evals", "whatif")
# The token-table aggregations the pages run (tokengrad.read.queries, all computed inside DuckDB).
QUERIES = {
    f.__name__: f
    for f in (
        queries.token_frequencies,
        queries.grad_norm_by_prob,
        queries.top_tokens,
        queries.top_samples,
        queries.sample_tokens,
        queries.token_steps,
        queries.token_totals,
        token_shares.step_updates,
        share_queries.share_by_partition,
        share_queries.attributed_steps,
        gradient_shares.gradient_by_bucket,
        gradient_shares.step_gradients,
        entropy_queries.entropy_drainers,
        entropy_queries.entropy_quadrants,
        entropy_queries.entropy_by_position,
        entropy_law.entropy_law,
        rollout_queries.has_rollout,
        rollout_queries.gap_by_prob,
        rollout_queries.gap_by_position,
        rollout_queries.mismatch_update_share,
        rollout_queries.masked_sequences,
        rollout_queries.gap_summary,
        rollout_queries.has_staleness,
        rollout_queries.off_policy_split,
        rollout_queries.confident_disagreements,
    )
}
_CACHE_ENTRIES = 64
_CACHE_TTL_S = 900  # seconds: a run nobody looks at any more frees its memory
_LATEST: dict[tuple, Signature] = {}  # (loader, its other arguments) -> the signature cached last


class RunLoadError(RuntimeError):
    """A run directory that cannot be opened (missing or unreadable meta.json, newer schema)."""


def _stat(path: Path, base: Path) -> tuple[str, int, int] | None:
    try:
        st_ = path.stat()
    except OSError:  # removed between listing and stat (compaction)
        return None
    return (str(path.relative_to(base)), st_.st_mtime_ns, st_.st_size)


def signature(run_dir: str, tables: tuple[str, ...] | None = None) -> Signature:
    """Files that make up `tables` of the run (all tables when None), plus meta.json and rank status
    (tokengrad.read.layout.run_files)."""
    base = Path(run_dir)
    return tuple(s for s in (_stat(p, base) for p in layout.run_files(base, tables)) if s is not None)


BUCKET_REFRESH_S = 5.0  # how old the local copy of a runs root in a bucket may get while pages are viewed
_bucket_lock = threading.Lock()
_bucket_copies: dict[str, dict] = {}  # root -> {"thread", "started", "error"} of its latest refresh


def refresh_bucket(root: str) -> str | None:
    """Start bringing the local copy of a runs root in a bucket up to date, on a thread of its own (one
    per root at a time, at most every BUCKET_REFRESH_S): pages never wait on the network, they read what
    the copy holds and Live refresh shows what arrives. Returns the last refresh's one-line error, or None
    (the copy made before stays served)."""
    with _bucket_lock:
        state = _bucket_copies.setdefault(root, {"thread": None, "started": -BUCKET_REFRESH_S, "error": None})
        busy = state["thread"] is not None and state["thread"].is_alive()
        if not busy and time.monotonic() - state["started"] >= BUCKET_REFRESH_S:
            state["started"] = time.monotonic()
            state["thread"] = threading.Thread(target=_copy, args=(root, state), daemon=True)
            state["thread"].start()
        return state["error"]


def _copy(root: str, state: dict) -> None:
    try:
        local_copy(root)
        state["error"] = None
    except RemoteError as err:
        state["error"] = str(err)


def runs_under(root: str) -> list[str]:
    """Run directories at or up to served_root.RUN_DEPTH levels below `root` (directory listings, not
    cached: live refresh must see new folders)."""
    return runs_below(root)


def _open(run_dir: str):
    try:
        return load_run(run_dir)
    except Exception as err:  # bad JSON, missing meta, newer schema: one message for the views
        raise RunLoadError(f"cannot open run {run_dir}: {type(err).__name__}: {err}") from err


class _CachedTablesRun(Run):
    """A run whose small tables come from this module's cache (`table`): the doctor and the headline read
    the copies the pages read, instead of reading the files again."""

    def __init__(self, run_dir: str):
        super().__init__(run_dir)
        self._run_dir = run_dir

    def table(self, name: str) -> pd.DataFrame:
        return table(self._run_dir, name) if name in SMALL_TABLES else super().table(name)


def open_run(run_dir: str) -> Run:
    """The run as a tokengrad.read.Run whose small tables (steps, layers, ...) are served from the cache;
    its token queries read the files (for a cached function that takes the run's signature)."""
    try:
        return _CachedTablesRun(run_dir)
    except Exception as err:  # bad JSON, missing meta, newer schema: one message for the views
        raise RunLoadError(f"cannot open run {run_dir}: {type(err).__name__}: {err}") from err


# ---- cached loaders (keyed on the signature) -------------------------------------------------------
@st.cache_data(show_spinner=False, max_entries=_CACHE_ENTRIES, ttl=_CACHE_TTL_S)
def _load_meta(run_dir: str, sig: Signature) -> dict:
    return _open(run_dir).meta


@st.cache_data(show_spinner=False, max_entries=_CACHE_ENTRIES, ttl=_CACHE_TTL_S)
def _load_table(run_dir: str, table: str, sig: Signature) -> pd.DataFrame:
    return _open(run_dir).table(table)  # corrupt files are skipped; warnings_for() reports them


@st.cache_data(show_spinner=False, max_entries=_CACHE_ENTRIES, ttl=_CACHE_TTL_S)
def _load_warnings(run_dir: str, sig: Signature) -> tuple[str, ...]:
    run = _open(run_dir)
    for table in schema.TABLES:
        run.files(table)  # validates every file's footer; corrupt ones land in run.warnings
    return tuple(run.warnings)


@st.cache_data(show_spinner=False, max_entries=_CACHE_ENTRIES, ttl=_CACHE_TTL_S)
def _load_losses(run_dir: str, sig: Signature) -> tuple[tuple[str, str], ...]:
    found = run_losses(_open(run_dir))
    return tuple((x.table, x.text) for x in (*found.unreadable, *found.missing))


@st.cache_data(show_spinner=False, max_entries=_CACHE_ENTRIES, ttl=_CACHE_TTL_S)
def _run_query(run_dir: str, name: str, sig: Signature, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return QUERIES[name](_open(run_dir), **dict(kwargs))


@st.cache_data(show_spinner=False, max_entries=_CACHE_ENTRIES, ttl=_CACHE_TTL_S)
def _pooled(run_dir: str, sig: Signature, step_range: tuple[int, int] | None) -> pd.DataFrame:
    buckets = table(run_dir, "buckets")
    if buckets.empty:
        return buckets
    return headline.pooled_bucket_shares(buckets, step_range, layers=table(run_dir, "layers"))


@st.cache_data(show_spinner=False, max_entries=_CACHE_ENTRIES, ttl=_CACHE_TTL_S)
def _headline(run_dir: str, sig: Signature, step_range: tuple[int, int] | None) -> headline.Headline:
    run = open_run(run_dir)
    shares = pooled_shares(run_dir, step_range) if not run.buckets.empty else None
    return headline.low_prob_shares(run, step_range, shares=shares)


def _current(loader, before: tuple, sig: Signature, after: tuple = ()) -> Any:
    """`loader(*before, sig, *after)`, after dropping what it cached for the same arguments under an older
    signature (a superseded copy is never asked for again)."""
    key = (loader.__name__, before, after)
    old = _LATEST.get(key)
    if old is not None and old != sig:
        loader.clear(*before, old, *after)
    _LATEST[key] = sig
    return loader(*before, sig, *after)


# ---- façade used by the views -----------------------------------------------------------------------
def meta(run_dir: str) -> dict:
    """The run's meta.json as a dict."""
    return _current(_load_meta, (run_dir,), signature(run_dir, ()))


def table(run_dir: str, name: str) -> pd.DataFrame:
    """A small table (steps, layers, buckets, samples, evals) of the run; empty frame when absent."""
    if name not in SMALL_TABLES:
        raise ValueError(f"table {name!r} is not loaded whole; small tables: {sorted(SMALL_TABLES)}")
    return _current(_load_table, (run_dir, name), signature(run_dir, (name,)))


def has_table(run_dir: str, name: str) -> bool:
    """Whether the run has any file of the table (without reading it)."""
    return len(signature(run_dir, (name,))) > len(signature(run_dir, ()))


def warnings_for(run_dir: str) -> tuple[str, ...]:
    """Problems met reading the run (corrupt or unreadable files), one message each."""
    return _current(_load_warnings, (run_dir,), signature(run_dir))


def losses_for(run_dir: str) -> tuple[tuple[str, str], ...]:
    """What the run's reads lack, as (table, line): unreadable files grouped with the steps they held,
    missing rank folders (tokengrad.read.unreadable); 5,000 empty files are one line."""
    return _current(_load_losses, (run_dir,), signature(run_dir))


def is_skip_warning(msg: str) -> bool:
    """A reader warning about one skipped file: losses_for says it, grouped."""
    return msg.startswith(("skipped file ", "skipped corrupt file "))


def query(run_dir: str, name: str, **kwargs) -> Any:
    """Run the DuckDB aggregation `tokengrad.read.queries.<name>` on the run's tables (cached)."""
    if name not in QUERIES:
        raise ValueError(f"unknown query {name!r}; known: {sorted(QUERIES)}")
    items = tuple(sorted((k, _hashable(v)) for k, v in kwargs.items()))
    return _current(_run_query, (run_dir, name), signature(run_dir, ("tokens", "samples")), (items,))


def pooled_shares(run_dir: str, step_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """tokengrad.read.headline.pooled_bucket_shares of the run's buckets (weighted with its layers'
    norms) over `step_range`, computed once per run and signature; the empty buckets table without one."""
    sig = signature(run_dir, ("buckets", "layers"))
    return _current(_pooled, (run_dir,), sig, (tuple(step_range) if step_range else None,))


def low_prob_shares(run_dir: str, step_range: tuple[int, int] | None = None) -> headline.Headline:
    """The run's headline shares (tokengrad.read.headline.low_prob_shares: the one definition)."""
    sig = signature(run_dir, ("buckets", "layers", "tokens", "prob_bins"))
    return _current(_headline, (run_dir,), sig, (tuple(step_range) if step_range else None,))


def status(run_dir: str) -> run_state.RunStatus:
    """running / finished / crashed / stopped (tokengrad.read.status; a few stat calls, not cached)."""
    return run_state.run_status(run_dir)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def live_signature(run_dirs: list[str]) -> tuple[Signature, ...]:
    """Signatures of several runs at once: what the live-refresh watcher compares between polls."""
    return tuple(signature(d) for d in run_dirs)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library, or no C library found)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim", None)
    except OSError:
        return None


def release_freed_memory() -> None:
    """Hand the heap pages freed by a script run back to the OS (glibc's malloc_trim, ~10 ms; a no-op
    elsewhere). Every script run reads and drops the tables again on a new thread; without this glibc kept
    their pages, and Live refresh grew the server by ~7 MB a refresh (benchmarks/bench_live_refresh.py)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
