"""A run directory's metadata: meta.json (what the run is, written by rank 0), the rank status files
(ranks/rankRRR.json: last step, rows written and dropped), and the check that a Recorder may write into a
directory (not a newer run format; the same run unless resuming)."""

from __future__ import annotations

import json
import os
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

from tokengrad import schema
from tokengrad._version import __version__
from tokengrad.read import layout
from tokengrad.record.store import strict_json
from tokengrad.record.store.writer import atomic_write_json

# meta.json keys that say which run a directory holds: a Recorder that is not resuming refuses a directory
# whose run differs in one of them (re-opening the same run to append is fine).
IDENTITY_KEYS = ("run_name", "config", "model", "weighting")


def tokenizer_label(name: str | None) -> str | None:
    """A tokenizer's name for meta.json: a hub-style id as it is, a local directory by its last component
    (an absolute cache path means nothing on another machine)."""
    if name and os.path.isabs(str(name)):
        return Path(str(name).rstrip("/")).name
    return name


def make_meta(
    run_dir: Path, *, config, info, model, tokenizer, world_size, buckets, attribution, budget, whatif=None
) -> dict:
    """meta.json of a new run (`info`: a record.options.RunInfo); a ValueError names a config key that JSON
    cannot hold (tokengrad.record.store.strict_json), before anything is claimed or written."""
    meta = {
        "schema_version": schema.SCHEMA_VERSION,
        "tokengrad_version": __version__,
        "run_name": info.name or run_dir.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config or {},
        "weighting": info.weighting or {"name": "none", "params": {}},
        "model": info.model_name or (type(model).__name__ if model is not None else None),
        "tokenizer": tokenizer_label(getattr(tokenizer, "name_or_path", None))
        or (type(tokenizer).__name__ if tokenizer else None),
        "world_size": world_size,
        "bucket_every": buckets.every,
        "bucket_edges": list(buckets.edges),
        "attribute_every": attribution.every,
        "attribute_method": attribution.method,
        "attribute_entropy": attribution.entropy,
        "token_budget": budget.k if budget else None,
        "whatif_every": whatif.every if whatif else 0,
        "whatif_rules": whatif.labels() if whatif else [],
        "rows_dropped": {},
        "finished": False,
        "temperature": info.temperature,
    }
    strict_json.to_json(meta)
    return meta


def refuse_rows_without_meta(run_dir: Path, rank: int, resuming: bool) -> None:
    """A directory holding rows of this rank but no meta.json was left by a process killed before it wrote
    its metadata (or by an import of an earlier tokengrad): recording into it would add to that attempt, so
    it is refused unless resuming (resume_step removes its rows from that step on first)."""
    if resuming or (run_dir / schema.META_FILE).exists():
        return
    files = [p for t in schema.TABLES for _, _, p in layout.entries(run_dir / schema.rank_dir(t, rank))]
    if files:
        raise ValueError(
            f"{run_dir} holds {len(files)} data file(s) of rank {rank} but no meta.json, as a recording "
            "killed before it wrote its metadata leaves it: delete the folder to start over, or pass "
            "resume_step=N to continue it (its rows of steps >= N are removed first)"
        )


def check_claim(run_dir: Path, meta: dict, resuming: bool) -> dict | None:
    """The directory's existing meta.json (None if there is none), after checking that a Recorder with
    `meta` may write there: not a newer run format, and the same run unless resuming."""
    path = run_dir / schema.META_FILE
    if not path.exists():
        return None
    try:
        old = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); refusing to overwrite it") from None
    if not isinstance(old, dict):
        raise ValueError(
            f"{path} must hold a JSON object, got {type(old).__name__}; refusing to overwrite it"
        )
    version = old.get("schema_version")
    if isinstance(version, int) and version > schema.SCHEMA_VERSION:
        raise ValueError(
            f"{run_dir} holds a run of run-format schema version {version}; this tokengrad writes "
            f"version {schema.SCHEMA_VERSION} and will not downgrade it. Upgrade tokengrad."
        )
    if not resuming:
        differ = [k for k in IDENTITY_KEYS if _plain_json(old.get(k)) != _plain_json(meta[k])]
        if differ:
            raise ValueError(
                f"{run_dir} already holds another run ({', '.join(differ)} differ from this "
                "Recorder's); choose another directory, or pass resume_step=... to continue that run"
            )
    return old


def carried_rows_dropped(run_dir: Path, rank: int, old_meta: dict | None) -> dict[str, int]:
    """rows_dropped of this rank before this session (rank status file, else meta.json for rank 0)."""
    try:
        status = json.loads((run_dir / schema.RANKS_DIR / f"rank{rank:03d}.json").read_text())
        counts = status.get("rows_dropped")
    except (OSError, ValueError, AttributeError):
        counts = (old_meta or {}).get("rows_dropped") if rank == 0 else None
    if not isinstance(counts, dict):
        return {}
    return {str(k): v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)}


def write_meta(run_dir: Path, meta: dict, finished: bool, rows_dropped: dict) -> bool:
    """Write meta.json (keeping a resumed run's creation time); False (and a warning) if the disk refuses."""
    path = run_dir / schema.META_FILE
    meta = dict(meta)
    try:
        meta["created"] = json.loads(path.read_text()).get("created", meta["created"])
    except (OSError, ValueError, AttributeError):
        pass
    meta["finished"] = finished
    meta["rows_dropped"] = rows_dropped
    try:
        atomic_write_json(path, meta)
    except (OSError, ValueError) as err:  # a full disk; a key JSON cannot hold (strict_json names it)
        warnings.warn(f"tokengrad: could not write {path}: {err}", RuntimeWarning, stacklevel=3)
        return False
    return True


def write_status(
    run_dir: Path, rank: int, finished: bool, last_step: int | None, writer, *, upload: dict | None = None
) -> bool:
    """Write this rank's status file; False (and a warning) when the disk refuses. `upload`: a run in a
    bucket's upload state (its URL, files not uploaded yet, the staging folder; record/store/bucket.py)."""
    folder = run_dir / schema.RANKS_DIR
    status = {
        "rank": rank,
        "finished": finished,
        "last_step": last_step,
        "rows_dropped": dict(writer.rows_dropped) if writer else {},
        "rows_written": dict(writer.rows_written) if writer else {},
        "time": time.time(),
        **({"upload": upload} if upload is not None else {}),
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / f"rank{rank:03d}.json", status)
    except OSError as err:
        warnings.warn(
            f"tokengrad: could not write rank status to {folder}: {err}", RuntimeWarning, stacklevel=3
        )
        return False
    return True


def _plain_json(value):
    """A value as meta.json gives it back (tuples become lists, NaN null), to compare with a new run's."""
    return strict_json.to_json(value)
