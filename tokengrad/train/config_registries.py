"""The registries that config keys name (task, weighting, aggregation, ...), each imported only when a
key is checked or described, so that reading a config stays cheap until a registry is needed."""

from __future__ import annotations

from typing import Mapping, Sequence


def tasks() -> Mapping:
    import tokengrad.train.tasks  # noqa: F401  (importing the package registers the built-in tasks)
    from tokengrad.train.tasks.base import TASKS

    return TASKS


def weightings() -> Mapping:
    from tokengrad.objective.weighting import WEIGHTINGS

    return WEIGHTINGS


def aggregations() -> Mapping:
    from tokengrad.objective.loss import AGGREGATIONS

    return AGGREGATIONS


def adv_scales() -> Mapping:
    from tokengrad.objective.advantages import ADVANTAGE_SCALES

    return ADVANTAGE_SCALES


def rollout_corrections() -> Sequence:
    from tokengrad.objective.rollout_correction import MODES

    return ("off", *MODES)


def attribution_methods() -> Mapping:
    from tokengrad.record.attribution import ATTRIBUTION_METHODS

    return ATTRIBUTION_METHODS
