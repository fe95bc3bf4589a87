"""Read-only importers: per-token dumps that other frameworks write themselves, loaded into the run format
(tokengrad.schema) so that the dashboard and the doctor work on them, without gradients.

    from tokengrad.importers import import_run, IMPORTERS
    meta = import_run("prime_rl", "outputs/run", "runs/prime_import")   # meta.json of the new run
    meta["imported"]["not_recorded"]["tokens"]                          # ["coef", "old_logprob", ...]
    print(IMPORTERS.describe())                                         # one line per format

Each format is a function registered under its name (tokengrad.registry: an unknown name raises, listing the
known ones). It reads the source, never changes it, and writes through tokengrad.importers.sink, which
leaves every column the source has no value for null and names them in meta.json["imported"]. Command line:
`tokengrad import FORMAT SRC --out RUN_DIR`. Formats and their layouts: docs/importers.md.
"""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path

from tokengrad.registry import Registry

IMPORTERS: Registry = Registry("import format")
# the modules whose functions register the built-in formats (loaded on first use: they need torch)
BUILTIN_MODULES = ("trl_completions", "prime_rl", "nemo_rl")


def register_importer(name: str, **attrs):
    """Decorator: `fn(src: Path, out: Path, **options) -> dict` (meta.json of the new run) under `name`."""
    return IMPORTERS.register(name, **attrs)


def load_importers() -> Registry:
    for module in BUILTIN_MODULES:
        importlib.import_module(f"tokengrad.importers.{module}")
    return IMPORTERS


def import_run(fmt: str, src: str | os.PathLike, out: str | os.PathLike, **options) -> dict:
    """Import the dump at `src` (a file or folder of format `fmt`) into a new run directory `out`; returns
    its meta.json. `options` are the format's own (e.g. group_size); one it does not take raises."""
    fn = load_importers()[fmt]
    given = {k: v for k, v in options.items() if v is not None}
    takes = [p for p in inspect.signature(fn).parameters if p not in ("src", "out")]
    unknown = sorted(set(given) - set(takes))
    if unknown:
        raise ValueError(f"import format {fmt!r} takes no option {unknown}; its options: {takes or 'none'}")
    src = Path(src)
    if not src.exists():
        raise FileNotFoundError(f"no such file or folder: {src}")
    return fn(src, Path(out), **given)


__all__ = ["IMPORTERS", "import_run", "load_importers", "register_importer"]
