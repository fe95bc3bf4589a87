"""Experiment trackers: a run's per-step aggregates (`scalars`) written to TensorBoard or Weights & Biases
(`backends`, a registry of backends). `tokengrad publish` (tokengrad.cli.publish) is the command."""

from tokengrad.integrations.trackers.backends import (
    TRACKERS,
    TensorBoardTracker,
    Tracker,
    WandbTracker,
    make_tracker,
    publish_run,
)

__all__ = ["TRACKERS", "TensorBoardTracker", "Tracker", "WandbTracker", "make_tracker", "publish_run"]
