"""The registries that config keys name (task, weighting, aggregation, ...). Names come from
tokengrad.train.names, which knows the built-in ones without importing torch (and reads the live registry
once its module is loaded, so plugins count); tasks are torch-free and imported when a key is checked."""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

from tokengrad.train.names import registered


def tasks() -> Mapping:
    import tokengrad.train.tasks  # noqa: F401  (importing the package registers the built-in tasks)
    from tokengrad.train.tasks.base import TASKS

    return TASKS


def weightings() -> Collection[str]:
    return registered("weighting")


def aggregations() -> Collection[str]:
    return registered("aggregation")


def adv_scales() -> Collection[str]:
    return registered("adv_scale")


def rollout_corrections() -> Sequence:
    return ("off", *registered("rollout_correction"))


def attribution_methods() -> Collection[str]:
    return registered("attribute_method")
