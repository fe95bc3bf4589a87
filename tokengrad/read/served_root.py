"""The served-root rule: which runs folder the dashboard serves, and which folders it may open.

Run folders hold prompts and completions, so the app's "Runs folder" box only opens folders inside the
served root (symlinks resolved first), unless the server was started with `--allow-any-folder`.
"""

from __future__ import annotations

import os
from pathlib import Path

from tokengrad.read import remote
from tokengrad.read.meta_file import is_run_dir

ENV_ROOT = "TOKENGRAD_RUNS_ROOT"  # read by the app when it is started without --root
ALLOW_ANY_FLAG = "--allow-any-folder"
PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # holds the `tokengrad` package
DEMO_ROOT = Path(__file__).resolve().parents[1] / "demo"  # the small run shipped inside the package
NO_RUNS_FLAG = "--no-runs-in"  # the app's flag: this folder holds no runs, so the demo is served instead


def default_root() -> Path:
    """The current folder: `tokengrad dashboard` started without a folder serves the runs below it."""
    return Path.cwd()


def serve_plan(root: str | os.PathLike | None) -> tuple[Path, Path | None]:
    """The runs root to serve, and the folder without runs it stands in for (None when it stands in for
    none): started without a folder (nor $TOKENGRAD_RUNS_ROOT) where no run lies below the current folder,
    the dashboard serves DEMO_ROOT and says how to record a run in that folder."""
    resolved = resolve_root(root)
    if root or os.environ.get(ENV_ROOT) or not resolved.is_dir() or runs_below(resolved):
        return resolved, None
    return DEMO_ROOT.resolve(), resolved


def resolve_root(root: str | os.PathLike | None) -> Path:
    """The runs root to serve: `root` if given, else $TOKENGRAD_RUNS_ROOT, else default_root(). A bucket
    prefix (s3://bucket/runs) is served from its local copy (tokengrad.read.remote; the app refreshes it)."""
    url = remote.parse_url(root) if root else None
    if url is not None:
        return remote.cache_path(url, "remote").resolve()
    if root:
        return Path(root).expanduser().resolve()
    env = os.environ.get(ENV_ROOT)
    return Path(env).expanduser().resolve() if env else default_root().resolve()


def confine(folder: str | os.PathLike, root: str | os.PathLike, allow_any: bool = False) -> Path:
    """`folder` resolved (symlinks followed), if it lies inside the served `root` or `allow_any`; otherwise a
    ValueError that says how to allow it."""
    try:
        path = Path(folder).expanduser().resolve()
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop (Python < 3.13)
        raise ValueError(f"{folder} cannot be opened: {err}") from None
    real_root = Path(root).expanduser().resolve()
    if allow_any or path.is_relative_to(real_root):
        return path
    raise ValueError(
        f"{path} is outside the served folder {real_root}; start the dashboard on a folder that "
        f"holds it, or with {ALLOW_ANY_FLAG} to browse any folder"
    )


RUN_DEPTH = 3  # run folders are listed this many levels below the runs folder (e.g. sweep/seed/run)


def open_folder(typed: str | os.PathLike, root: str | os.PathLike, allow_any: bool = False) -> Path:
    """The folder the Runs-folder box names: a relative name is taken inside the served `root`, then
    confine()d; a ValueError says "does not exist" for a missing folder."""
    path = Path(typed).expanduser()
    if not path.is_absolute():
        path = Path(root).expanduser().resolve() / path
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    if not path.is_dir():
        raise ValueError(f"{path} is not a folder")
    return confine(path, root, allow_any)


def runs_below(root: str | os.PathLike, depth: int = RUN_DEPTH) -> list[str]:
    """Run directories (holding meta.json) at `root` or up to `depth` levels below it, sorted; a run's own
    subfolders are not searched, hidden folders are skipped, and symlinks leading out of `root` are
    skipped (tokengrad.read.runs.list_runs per level)."""
    from tokengrad.read.runs import list_runs

    root = Path(root)
    found = list_runs(root)
    if found and found[0] == str(root):
        return found
    real = root.resolve()
    out, level = list(found), [root]
    for _ in range(depth - 1):
        below = []
        for folder in level:
            for p in sorted(folder.iterdir()) if folder.is_dir() else ():
                if p.is_dir() and not p.name.startswith(".") and not is_run_dir(p):
                    if p.resolve().is_relative_to(real):
                        below.append(p)
        for p in below:
            out += [r for r in list_runs(p) if r != str(p)]
        level = below
    return sorted(out)
