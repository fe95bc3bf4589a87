"""The live doctor: detectors on the committed steps of a run being recorded, on a thread of its own.

    live = LiveDoctor(run_dir, Doctor(halt=True, on_finding=print), trackers)
    live.committed(step)          # the training thread: O(1), never waits
    live.halt                     # the critical finding that asks for a stop, or None
    live.close(last_step)         # a last diagnosis of the final state, then the thread ends

The Recorder calls `committed(k)` once step k's files are on disk (at the end of step k+1, when the writer
has finished step k; at close for the last step). Calls that arrive while a diagnosis runs coalesce: the
next diagnosis reads everything committed by then. Each finding alerts once (a gradient spike once per
step; another detector once per severity).
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path

from tokengrad.doctor.engine import diagnose, load_detectors
from tokengrad.doctor.finding import Finding
from tokengrad.doctor.registry import DETECTORS
from tokengrad.doctor.view import RunView


class LiveDoctor:
    def __init__(self, run_dir: str | Path, options, trackers=()):
        load_detectors()
        if options.detectors is not None:
            [DETECTORS[n] for n in options.detectors]  # an unknown name raises here, not on the thread
        self.run_dir, self.options, self.trackers = Path(run_dir), options, list(trackers)
        self.findings: list[Finding] = []  # alerted, in order
        self.halt: Finding | None = None
        self.errors: list[str] = []
        self.latency: list[tuple[int, float]] = []  # (step, seconds from committed() to its diagnosis)
        self._seen: set[tuple] = set()
        self._cv = threading.Condition()
        self._pending: tuple[int, float] | None = None
        self._done = -1
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="tokengrad-doctor", daemon=True)
        self._thread.start()

    # ---- the training thread ------------------------------------------------------------------------
    def committed(self, step: int) -> None:
        with self._cv:
            self._pending = (int(step), time.perf_counter())
            self._cv.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the last committed step has been diagnosed; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self._pending is None or not self._thread.is_alive(), timeout)

    def close(self, last_step: int | None = None, timeout: float = 120.0) -> None:
        if last_step is not None:
            self.committed(last_step)
        self.drain(timeout)
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout)

    # ---- the doctor's thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._pending is not None or self._stop)
                if self._pending is None:
                    return
                step, since = self._pending
            try:
                self._diagnose(step)
            except Exception as err:  # noqa: BLE001 - a reading error must not end live diagnosis
                self.errors.append(f"step {step}: {type(err).__name__}: {err}")
            with self._cv:
                self.latency.append((step, time.perf_counter() - since))
                if self._pending is not None and self._pending[0] == step:
                    self._pending = None
                self._done = step
                self._cv.notify_all()

    def _diagnose(self, step: int) -> None:
        o = self.options
        only = list(o.detectors) if o.detectors is not None else None
        for f in diagnose(RunView.open(self.run_dir, upto=step), only=only):
            key = (
                f.id,
                f.severity,
                f.first_step if getattr(DETECTORS.get(f.id), "per_event", False) else None,
            )
            if key in self._seen or f.confidence < o.min_confidence or not f.at_least(o.alert_on):
                continue
            self._seen.add(key)
            self.findings.append(f)
            self._alert(f, step)
            if o.halt and f.severity == "critical" and self.halt is None:
                self.halt = f

    def _alert(self, f: Finding, step: int) -> None:
        title = f"tokengrad doctor: {f.id} ({f.severity})"
        text = f"{f.run} step {f.first_step}: {f.message}"
        for tracker in self.trackers:
            alert = getattr(tracker, "alert", None)
            if alert is not None:
                self._call(alert, title, text, f.severity, step)
        if self.options.on_finding is not None:
            self._call(self.options.on_finding, f)

    def _call(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as err:  # noqa: BLE001 - a failing alert must not stop the others or the thread
            msg = f"doctor alert {getattr(fn, '__name__', fn)!r} failed: {type(err).__name__}: {err}"
            self.errors.append(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
