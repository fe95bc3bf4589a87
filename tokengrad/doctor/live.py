"""The live doctor: detectors on the committed steps of a run being recorded, on a thread of their own.

    live = LiveDoctor(run_dir, Doctor(halt=True, on_finding=print), trackers)
    live.committed(step)          # the training thread: O(1), never waits
    live.halt                     # the critical finding that asks for a stop, or None
    live.close(last_step)         # a last diagnosis of the final state (at most Doctor.close_timeout s)

The Recorder calls `committed(k)` once step k's files are on disk (at the end of step k+1, when the writer
has finished step k; at close for the last step). Calls that arrive while a diagnosis runs coalesce: the
next diagnosis reads everything committed by then. Each finding alerts once (a gradient spike once per
step; another detector once per severity).

Each detector runs on a thread of its own, waited for at most `Doctor.detector_timeout` seconds: Python
cannot stop a thread, so a detector that hangs is named in a warning, left running, and skipped until it
returns, while the other detectors go on (a hang must not hide a critical finding). A detector that raises
is named in a warning once; the others still run.
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


class DoctorWarning(UserWarning):
    """A detector of the live doctor hung or failed, or an alert failed. Not a RuntimeWarning: the
    engine ignores RuntimeWarnings while a detector runs (the reader's skipped-file warnings), and a hung
    detector's thread would keep that filter in place."""


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
        self.running: str | None = None  # the detector the doctor's thread waits for now
        self._busy: dict[str, threading.Thread] = {}  # detectors past their timeout, still running
        self._failed: set[str] = set()  # detectors already warned about
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

    def close(self, last_step: int | None = None, timeout: float | None = None) -> None:
        """Diagnose the last step, waiting at most `timeout` seconds (default Doctor.close_timeout); a
        diagnosis still running then is left to its daemon thread and the detector it waits for is
        named in a warning."""
        timeout = self.options.close_timeout if timeout is None else timeout
        start = time.perf_counter()
        if last_step is not None:
            self.committed(last_step)
        drained = self.drain(timeout)
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(max(0.0, timeout - (time.perf_counter() - start)))
        if not drained:
            self._warn(
                f"tokengrad doctor: the last diagnosis did not finish within {timeout:g} s at close "
                f"(detector {self.running!r} still running); run `tokengrad doctor {self.run_dir}` "
                "for the final findings"
            )

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

    def _names(self) -> list[str]:
        names = list(self.options.detectors) if self.options.detectors is not None else list(DETECTORS)
        return [n for n in names if not (n in self._busy and self._busy[n].is_alive())]

    def _diagnose(self, step: int) -> None:
        view = RunView.open(self.run_dir, upto=step)
        for name in self._names():
            found = self._run(name, view, step)
            if found is None:  # hung: the rest read a view of their own (its caches may be mid-load)
                view = RunView.open(self.run_dir, upto=step)
                continue
            for f in found:
                self._consider(f, step)

    def _run(self, name: str, view: RunView, step: int) -> list[Finding] | None:
        """The findings of one detector, or None when it did not return within detector_timeout."""
        box: list = []

        def work():
            try:
                box.append(diagnose(view, only=[name]))
            except Exception as err:  # noqa: BLE001 - reported below, on the doctor's thread
                box.append(err)

        thread = threading.Thread(target=work, name=f"tokengrad-doctor-{name}", daemon=True)
        self.running = name
        thread.start()
        thread.join(self.options.detector_timeout)
        self.running = None
        if thread.is_alive():
            self._busy[name] = thread
            wait = self.options.detector_timeout
            self._fail(
                name,
                f"detector {name!r} did not return within {wait:g} s at step {step}; skipped "
                "until it returns",
            )
            return None
        out = box[0] if box else []
        if isinstance(out, Exception):
            self._fail(name, f"detector {name!r} failed at step {step}: {type(out).__name__}: {out}")
            return []
        for f in out:
            if f.id == "detector_error":  # still a finding (info); the warning names the detector
                self._fail(name, f"{f.message} (step {step})")
        return out

    def _fail(self, name: str, what: str) -> None:
        msg = f"tokengrad doctor: {what}"
        self.errors.append(msg)
        if name not in self._failed:  # once per detector: a hang or a bad column repeats every step
            self._failed.add(name)
            self._warn(msg)

    def _consider(self, f: Finding, step: int) -> None:
        o = self.options
        per_event = getattr(DETECTORS.get(f.id), "per_event", False)
        key = (f.id, f.severity, f.first_step if per_event else None)
        if key in self._seen or f.confidence < o.min_confidence or not f.at_least(o.alert_on):
            return
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
            self._warn(msg)

    def _warn(self, msg: str) -> None:
        warnings.warn(msg, DoctorWarning, stacklevel=3)
