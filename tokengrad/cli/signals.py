"""SIGTERM, as schedulers, `docker stop` and service managers send it, unwinding a command like Ctrl-C:
`finally` blocks and context managers run (the recorder flushes and closes, a server's child is stopped)
instead of the process vanishing as under SIGKILL."""

from __future__ import annotations

import contextlib
import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that it unwinds like Ctrl-C."""


@contextlib.contextmanager
def sigterm_unwinds():
    """SIGTERM raises Terminated while the block runs; a second SIGTERM kills as usual."""

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
