"""Where an import is written until it is complete: a hidden staging folder next to the target, moved into
place by one rename once meta.json is written, so that the target never holds part of a run.

    stage = Staging(out)      # refuses an `out` that holds anything; clears what killed imports left
    ...                       # write the run into stage.path
    stage.commit()            # rename stage.path -> out (an empty `out` is replaced)
    stage.discard()           # or: remove the staging folder (an import that failed)

The staging folder is `.<name>.importing-<pid>-<random>` in the target's parent folder. It is claimed like
a run being recorded (record/store/claim.py: ranks/rank000.lock names the process), so a re-run can tell
a staging folder whose import still runs (refused, naming its pid) from one a killed import left (removed,
with a warning saying so): a re-run starts over and never adds to a partial attempt.
"""

from __future__ import annotations

import errno
import os
import shutil
import warnings
from pathlib import Path

from tokengrad.faults import fault_point
from tokengrad.record.store import claim

STAGING_MARK = ".importing-"


def staging_prefix(out: Path) -> str:
    return f".{out.name}{STAGING_MARK}"


class Staging:
    """The staging folder of one import into `out` (module doc)."""

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        refuse_unless_empty(self.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        clear_leftovers(self.out)
        self.path = self.out.parent / f"{staging_prefix(self.out)}{os.getpid()}-{os.urandom(4).hex()}"
        self._claim = claim.take(self.path, 0)  # creates the folder with its claim in it

    def commit(self) -> None:
        """Move the finished run into place: one rename, which fails if `out` is no longer empty."""
        fault_point("import_staged")
        try:
            claim.move(self._claim, self.path, self.out)
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            self.discard()
            raise ValueError(
                f"{self.out} was filled by something else while the import ran; nothing of this import was "
                "kept: choose a new folder for the import"
            ) from None
        self._claim.release()

    def discard(self) -> None:
        """Remove the staging folder and its claim (idempotent)."""
        self._claim.release()
        shutil.rmtree(self.path, ignore_errors=True)


def refuse_unless_empty(out: Path) -> None:
    """A ValueError, in one line naming the folder and what to do, unless `out` is absent or empty."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise ValueError(f"{out} is a file, not a folder; choose a new folder for the import")
    held = sorted(p.name for p in out.iterdir())
    if not held:
        return
    if "meta.json" in held:
        raise ValueError(f"{out} already holds a run; choose a new folder for the import")
    shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
    raise ValueError(
        f"{out} is not empty and holds no run ({shown}; e.g. what an import killed by an earlier tokengrad "
        "left): delete it or choose a new folder for the import"
    )


def clear_leftovers(out: Path) -> None:
    """Remove the staging folders of imports into `out` whose process is gone (a warning names each); an
    import into `out` that still runs is refused (claim.RunClaimedError naming its pid)."""
    for folder in sorted(out.parent.glob(staging_prefix(out) + "*")):
        if not folder.is_dir() or folder.is_symlink():
            continue
        try:
            with warnings.catch_warnings():  # "broke the stale claim": said below, with what it means
                warnings.simplefilter("ignore", RuntimeWarning)
                leftover = claim.take(folder, 0)  # breaks the claim of a process that is gone
        except claim.RunClaimedError as err:
            raise claim.RunClaimedError(f"another import into {out} is running: {err}") from None
        shutil.rmtree(folder, ignore_errors=True)
        leftover.release()
        warnings.warn(
            f"tokengrad: removed {folder}, the partial import an interrupted import into {out} left; "
            "this import starts over",
            RuntimeWarning,
            stacklevel=3,
        )
