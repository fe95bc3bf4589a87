"""The trainer's `doctor` key: off, alert (the live doctor's findings to stderr and the trackers) or halt
(also a clean stop with a checkpoint on a critical finding).

The halt is decided at the step boundary by every rank together (a max all-reduce of "rank 0's doctor has
a critical finding"), so in DDP all ranks stop after the same step; the live doctor itself runs on rank 0.
"""

from __future__ import annotations

import sys

from tokengrad.record.options import Doctor
from tokengrad.train import distributed as dist

DOCTOR_MODES = ("off", "alert", "halt")


class TrainerDoctor:
    def __init__(self, mode: str):
        if mode not in DOCTOR_MODES:
            raise ValueError(f"doctor must be one of {DOCTOR_MODES}, got {mode!r}")
        self.mode = mode
        self.finding = None  # the critical finding that stopped the run

    def options(self) -> Doctor | None:
        """The Recorder's doctor= option (the trainer halts itself, so the Recorder never raises)."""
        return None if self.mode == "off" else Doctor(on_finding=self._on_finding)

    def _on_finding(self, f) -> None:  # the doctor's thread
        print(f"tokengrad doctor: {f.severity} {f.id}: {f.message}", file=sys.stderr)
        if self.mode == "halt" and f.severity == "critical" and self.finding is None:
            self.finding = f

    def should_stop(self) -> bool:
        """At a step boundary, on every rank: whether rank 0's doctor asked for a stop."""
        if self.mode != "halt":
            return False
        return bool(dist.all_reduce([float(self.finding is not None)], "max")[0])
