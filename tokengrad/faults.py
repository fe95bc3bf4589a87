"""Named fault points, so that tests and scripts/fault_injection.py can drive crash windows deterministically.

The writer, the recorder and the checkpoint code call `fault_point(name)` at the moments where a crash or a
slow or full disk matters. Nothing happens unless the environment variable TOKENGRAD_FAULT names the point:

    TOKENGRAD_FAULT="commit:sleep=0.5"              # every commit waits 0.5 s (a slow disk such as NFS)
    TOKENGRAD_FAULT="compacted:kill@2"               # SIGKILL this process at the 2nd merged file
    TOKENGRAD_FAULT="write:raise,meta:raise"         # every Parquet write and meta.json write: ENOSPC

Actions: `kill` (SIGKILL, as `kill -9` would), `sleep=SECONDS`, `raise` (OSError ENOSPC, a full disk) and
`crash` (raise SimulatedCrash, a BaseException that no `except Exception` catches: an in-process stand-in
for a kill whose on-disk state tests can inspect). `@N` fires at the N-th time the point is reached only.

Points: commit (before a commit file is written), write (before any Parquet file is written), compacted
(merged file written, small files not yet removed), unlinked (after each small file a merge removes),
meta (before meta.json / rank status are written), checkpoint_write (before a checkpoint is written),
checkpoint_renamed (between the two renames of a checkpoint save), checkpoint_saved (a checkpoint is
complete), import_staged (an import is complete in its staging folder, not yet moved into place),
upload (before each file a run in a bucket uploads: `raise` stands for a network failure).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections import Counter

ENV = "TOKENGRAD_FAULT"
POINTS = (
    "commit",
    "write",
    "compacted",
    "unlinked",
    "meta",
    "checkpoint_write",
    "checkpoint_renamed",
    "checkpoint_saved",
    "import_staged",
    "upload",
)
_hits: Counter = Counter()


class SimulatedCrash(BaseException):
    """Raised by the `crash` action; a BaseException so that no error handler on the way swallows it."""


def parse(spec: str) -> list[tuple[str, str, int | None]]:
    """`point:action[@n],...` -> [(point, action, n)]; a ValueError names an unknown point or action."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        point, _, rest = item.partition(":")
        action, _, nth = rest.partition("@")
        if point not in POINTS:
            raise ValueError(f"{ENV}: unknown fault point {point!r}; known: {list(POINTS)}")
        if action not in ("kill", "raise", "crash") and not action.startswith("sleep="):
            raise ValueError(f"{ENV}: unknown action {action!r} in {item!r}; use kill, raise, crash, sleep=S")
        out.append((point, action, int(nth) if nth else None))
    return out


def fault_point(name: str) -> None:
    """Apply the fault TOKENGRAD_FAULT sets for this point, if any (a no-op otherwise)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    _hits[name] += 1
    for point, action, nth in parse(spec):
        if point != name or (nth is not None and nth != _hits[name]):
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "raise":
            raise OSError(errno.ENOSPC, f"No space left on device ({ENV} at {name})")
        elif action == "crash":
            raise SimulatedCrash(f"{ENV} at {name}")
        else:
            time.sleep(float(action.split("=", 1)[1]))


def reset() -> None:
    """Forget how often each point was reached (tests that set `@N` twice in one process)."""
    _hits.clear()
