"""A run's meta.json: the one reader, and one accessor per fact the read side and the dashboard take from
it. The file is read defensively: what a damaged or hand-edited file holds is named, with the file, instead
of failing later in a chart or a traceback. No torch.

    meta = read_meta(run_dir)         # the dict (Run.meta); a MetaError names what is wrong
    origin(meta)                      # "trl", "verl", "trainer" or "loop": how the run was recorded
    family(meta)                      # (task, length): runs that compare on one chart
    run_name(meta), token_budget(meta), rows_dropped(meta), lopti_low_first(meta)

The accessors take any mapping (a dict read_meta returned, or {} for a run that could not be read) and
give the fact or its stated default, never a KeyError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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


# config["integration"] -> how the run was recorded; a config holding the built-in trainer's keys is
# "trainer" (tokengrad train), anything else a plain loop around a Recorder ("loop").
INTEGRATIONS = {"trl": "trl", "verl": "verl"}
TRAINER_KEYS = frozenset({"task", "prompts_per_step", "group_size", "bucket_every"})
ORIGINS = ("trl", "verl", "trainer", "loop")


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


def is_run_dir(folder: str | Path) -> bool:
    """Whether `folder` holds a meta.json (what makes a folder a run)."""
    return (Path(folder) / schema.META_FILE).exists()


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


# ---- the facts ----------------------------------------------------------------------------------------
def config(meta: Mapping | None) -> dict:
    """The settings the producer wrote (`config`): TrainConfig, TRL's under "args", a loop's own dict."""
    cfg = (meta or {}).get("config")
    return cfg if isinstance(cfg, dict) else {}


def run_name(meta: Mapping | None) -> str | None:
    """The name meta.json gives the run (`run_name`); None when it gives none. The run's identity is its
    folder (Run.name): a copied folder keeps the original's run_name."""
    name = (meta or {}).get("run_name")
    return name if isinstance(name, str) and name else None


def origin(meta: Mapping | None) -> str:
    """How the run was recorded, one of ORIGINS: "trl", "verl", "trainer" (tokengrad train) or "loop"."""
    cfg = config(meta)
    integration = cfg.get("integration")
    if isinstance(integration, str) and integration in INTEGRATIONS:
        return INTEGRATIONS[integration]
    return "trainer" if TRAINER_KEYS <= set(cfg) else "loop"


def family(meta: Mapping | None) -> tuple[str, str]:
    """(task, length) of a run: runs of one family can be compared on one chart. The built-in trainer's
    task, task parameters and steps; TRL's max_steps; other runs have an empty task."""
    cfg = config(meta)
    args = cfg.get("args") if isinstance(cfg.get("args"), dict) else {}
    task = cfg.get("task") or cfg.get("integration") or ""
    params = cfg.get("task_params") or {}
    steps = cfg.get("steps") or args.get("max_steps") or ""
    return (f"{task} {sorted(params.items()) if isinstance(params, dict) else params}", str(steps))


def finished(meta: Mapping | None) -> bool:
    """Whether the recorder closed the run normally (`finished` is true; written false when it opens)."""
    return (meta or {}).get("finished") is True


def token_budget(meta: Mapping | None) -> int | None:
    """Token rows kept per step (`token_budget`: whole completions and the largest update shares), None
    when the run kept every row."""
    budget = (meta or {}).get("token_budget")
    return int(budget) if budget else None


def count_rows(counts) -> int:
    """The total of a rows_dropped mapping ({table: n}, as meta.json and the rank status files hold it);
    anything else counts 0."""
    if not isinstance(counts, dict):
        return 0
    return sum(v for v in counts.values() if isinstance(v, int) and not isinstance(v, bool))


def rows_dropped(meta: Mapping | None) -> int:
    """Rows the recorder could not write, over every table, as meta.json counts them (`rows_dropped`)."""
    return count_rows((meta or {}).get("rows_dropped"))


def lopti_low_first(meta: Mapping | None) -> bool | None:
    """Whether a Lopti run trained its low-probability tokens in update 0 (the rule's `low_first`, True
    when unset); None when the run's weighting rule is not Lopti (`weighting.name`)."""
    weighting = (meta or {}).get("weighting") or {}
    if "lopti" not in str(weighting.get("name", "")).lower():
        return None
    return bool((weighting.get("params") or {}).get("low_first", True))
