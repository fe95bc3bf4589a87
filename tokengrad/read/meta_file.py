"""A run's meta.json, read defensively: what a damaged or hand-edited file holds is named, with the file,
instead of failing later in a chart or a traceback. No torch."""

from __future__ import annotations

import json
from pathlib import Path

from tokengrad import schema

# The keys a reader relies on and the JSON types they must have (None: the key may be null).
KEY_TYPES: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "run_name": (str, type(None)),
    "config": (dict,),
    "weighting": (dict,),
    "model": (str, type(None)),
    "tokenizer": (str, type(None)),
    "world_size": (int,),
    "bucket_edges": (list,),
    "rows_dropped": (dict,),
    "finished": (bool,),
}
_JSON_NAMES = {int: "an integer", str: "text", dict: "an object", list: "a list", bool: "true or false"}


class MetaError(ValueError):
    """meta.json cannot be used; the message names the file and what is wrong."""


def read_meta(run_dir: Path, follow_links_out: bool = False) -> dict:
    """The parsed meta.json of `run_dir`; FileNotFoundError if missing, MetaError if damaged or if it links
    outside the run folder (as the run's data files, read only with `follow_links_out`)."""
    path = Path(run_dir) / schema.META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a tokengrad run: {schema.META_FILE} is missing")
    outside = None if follow_links_out else links_out(path, Path(run_dir))
    if outside:
        raise MetaError(
            f"{path} {outside}; not read (load_run(path, follow_links_out=True) reads a run whose files "
            "link out)"
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        where = f"byte {err.start}"
        raise MetaError(f"{path} is not valid UTF-8 ({where}); the run metadata is damaged") from None
    try:
        meta = json.loads(text)
    except RecursionError:
        raise MetaError(f"{path} is nested too deeply to read; the run metadata is damaged") from None
    except ValueError as err:
        raise MetaError(f"{path} is not valid JSON ({err}); the run metadata is damaged") from None
    if not isinstance(meta, dict):
        raise MetaError(f"{path} must hold a JSON object, got {type(meta).__name__}")
    if "schema_version" not in meta:
        raise MetaError(f"{path} has no schema_version; the run metadata is damaged")
    for key, types in KEY_TYPES.items():
        value = meta.get(key)
        if key in meta and not _is(value, types):
            want = " or ".join(_JSON_NAMES.get(t, "null") for t in types)
            raise MetaError(f"{path}: {key!r} must be {want}, got {json.dumps(value)[:60]}")
    return meta


def links_out(path: Path, run_dir: Path) -> str | None:
    """Why `path` may not be read as a file of `run_dir`: it leads outside the run folder; None if inside."""
    try:
        real, inside = path.resolve(strict=True), run_dir.resolve(strict=True)
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop (Python < 3.13)
        return f"cannot be resolved ({err})"
    return None if real.is_relative_to(inside) else f"links outside the run folder, to {real}"


def _is(value, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:  # JSON true is no integer
        return False
    return isinstance(value, types)
