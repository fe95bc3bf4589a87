"""Tracker backends: a run's aggregates (scalars.TAGS) in TensorBoard or Weights & Biases.

    tokengrad publish runs/demo --tensorboard tb/ --wandb my-project      # a finished or running run

    from tokengrad.integrations.trackers import make_tracker
    tb = make_tracker("tensorboard", "tb/demo")                           # or TensorBoardTracker("tb/demo")
    with Recorder("runs/demo", model=model, output=Output(trackers=[tb])) as rec: ...   # the same, live

Backends live in the TRACKERS registry (name -> class taking one target argument: a log directory, a
project). A backend opens its writer on the first scalar, so trackers handed to every rank create files
only where the Recorder publishes (rank 0). The Recorder passes each step's tables through `tee`, which
publishes them on the writer thread once they are built: tracking never holds up the training step.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from itertools import groupby

from tokengrad.integrations.trackers.scalars import Scalar, run_scalars, table_scalars
from tokengrad.registry import Registry

TRACKERS: Registry = Registry("tracker")
STEP_KEY = "step"  # W&B: the x axis the tokengrad/* metrics are plotted against
ALERT_TAG = "tokengrad/doctor"  # TensorBoard text summaries of the live doctor's findings


class Tracker:
    """A destination for scalars. Subclasses implement `_open()` and `_write(step, {tag: value})`."""

    def __init__(self):
        self._opened = False
        self._lock = threading.Lock()

    # ---- what subclasses implement ----------------------------------------------------------------
    def _open(self) -> None:
        raise NotImplementedError

    def _write(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    # ---- public ---------------------------------------------------------------------------------------
    def publish(self, scalars: Iterable[Scalar]) -> int:
        """Write scalars (in step order, as trackers like W&B require); returns how many were written."""
        ordered = sorted(scalars, key=lambda s: s.step)
        if not ordered:
            return 0
        with self._lock:
            if not self._opened:
                self._open()
                self._opened = True
            for step, group in groupby(ordered, key=lambda s: s.step):
                self._write(int(step), {s.tag: float(s.value) for s in group})
        return len(ordered)

    def alert(self, title: str, text: str, level: str = "warning", step: int = 0) -> None:
        """A live doctor's finding (tokengrad.doctor.live): backends that have alerts show it."""
        with self._lock:
            if not self._opened:
                self._open()
                self._opened = True
            self._alert(title, text, level, int(step))

    def _alert(self, title: str, text: str, level: str, step: int) -> None:
        """A backend without alerts ignores them."""

    def close(self) -> None:
        with self._lock:
            if self._opened:
                self._close()
                self._opened = False

    def tee(self, bundle: dict[str, object]) -> dict[str, object]:
        """A Recorder bundle (table -> pyarrow Table or zero-argument callable) whose tables, once all are
        built on the writer thread, are also published here. A table that fails to build is left out."""
        built: dict = {}
        left = [len(bundle)]

        def wrap(name: str, payload):
            # a record.writer.Rows (build, n) keeps its row count; read without importing the torch side
            rows = hasattr(payload, "build") and hasattr(payload, "n")
            make = payload.build if rows else payload

            def build():
                try:
                    data = make() if callable(make) else make
                    if data is not None and data.num_rows:
                        built[name] = data.to_pandas()
                    return data
                finally:
                    left[0] -= 1
                    if left[0] == 0:
                        self.publish(table_scalars(built))

            return type(payload)(build, payload.n) if rows else build

        return {name: wrap(name, payload) for name, payload in bundle.items()}

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@TRACKERS.register("tensorboard")
class TensorBoardTracker(Tracker):
    """Event files under `logdir`, written with TensorBoard's own EventFileWriter (no torch needed)."""

    def __init__(self, logdir: str | os.PathLike):
        super().__init__()
        self.logdir = os.fspath(logdir)
        self._writer = None

    def _open(self) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        os.makedirs(self.logdir, exist_ok=True)
        self._writer = EventFileWriter(self.logdir, flush_secs=10)

    def _write(self, step: int, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=t, simple_value=v) for t, v in values.items()])
        self._writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def _alert(self, title: str, text: str, level: str, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.plugins.text.summary_v2 import text_pb

        summary = text_pb(ALERT_TAG, f"**{title}**\n\n{text}")  # the TEXT tab, one entry per alert
        self._writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()

    def _close(self) -> None:
        self._writer.close()
        self._writer = None


@TRACKERS.register("wandb")
class WandbTracker(Tracker):
    """A W&B run in `project`. `mode="offline"` writes locally (synced later with `wandb sync`); extra keyword
    arguments go to `wandb.init` (name, dir, config, ...)."""

    def __init__(self, project: str, mode: str | None = None, **init_kwargs):
        super().__init__()
        self.project, self.mode, self.init_kwargs = project, mode, init_kwargs
        self.run = None

    def _open(self) -> None:
        import wandb

        kwargs = dict(self.init_kwargs)
        if self.mode is not None:
            kwargs["mode"] = self.mode
        self.run = wandb.init(project=self.project, reinit="create_new", **kwargs)
        # plot against tokengrad's step, not W&B's own log counter
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("tokengrad/*", step_metric=STEP_KEY)

    def _write(self, step: int, values: dict[str, float]) -> None:
        self.run.log({**values, STEP_KEY: step})

    def _alert(self, title: str, text: str, level: str, step: int) -> None:
        import wandb

        levels = {"critical": wandb.AlertLevel.ERROR, "warning": wandb.AlertLevel.WARN}
        self.run.alert(title=title, text=text, level=levels.get(level, wandb.AlertLevel.INFO))

    def _close(self) -> None:
        self.run.finish()
        self.run = None


def make_tracker(kind: str, target: str, **kwargs) -> Tracker:
    """A registered backend by name: make_tracker("tensorboard", "tb/"), make_tracker("wandb", "proj")."""
    return TRACKERS[kind](target, **kwargs)


def publish_run(run, trackers: Iterable[Tracker]) -> int:
    """Every scalar of a run (`tokengrad.read.runs.Run`) to each tracker; returns the number of scalars."""
    scalars = run_scalars(run)
    for tracker in trackers:
        tracker.publish(scalars)
    return len(scalars)
