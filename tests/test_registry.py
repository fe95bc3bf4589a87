"""tokengrad.registry: the one helper behind rules, tasks, models, aggregations and advantage scales."""

import pytest

from tokengrad.registry import Registry


def test_register_lookup_and_attributes():
    reg = Registry("widget")

    @reg.register("b", pointwise=True)
    def b():
        """B makes bees.

        More text."""

    @reg.register("a")
    def a():
        pass

    assert reg["b"] is b and b.pointwise is True
    assert sorted(reg) == ["a", "b"] and len(reg) == 2 and "a" in reg and "c" not in reg
    assert reg.get("c") is None and reg.get("a") is a
    assert reg.describe().splitlines() == ["a", "b  B makes bees."]


def test_duplicate_refused_and_unknown_listed():
    reg = Registry("widget")
    reg.register("a")(lambda: 1)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a")(lambda: 2)
    assert reg["a"]() == 1  # the first entry stays
    with pytest.raises(ValueError, match=r"unknown widget 'z'; known widgets: \['a'\]"):
        reg["z"]
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("")
    assert reg.unregister("a")() == 1 and "a" not in reg


@pytest.mark.parametrize(
    "module, name, kind",
    [
        ("tokengrad.objective.weighting", "WEIGHTINGS", "weighting rule"),
        ("tokengrad.train.tasks", "TASKS", "task"),
        ("tokengrad.train.models", "MODELS", "model"),
        ("tokengrad.objective.loss", "AGGREGATIONS", "aggregation"),
        ("tokengrad.objective.advantages", "ADVANTAGE_SCALES", "advantage scale"),
    ],
)
def test_every_extension_point_is_a_registry(module, name, kind):
    import importlib

    reg = getattr(importlib.import_module(module), name)
    assert isinstance(reg, Registry) and reg.kind == kind and len(reg) >= 2
    first = sorted(reg)[0]
    with pytest.raises(ValueError, match="already registered"):
        reg.register(first)(reg[first])
    with pytest.raises(ValueError, match=f"unknown {kind} 'nope'"):
        reg["nope"]


def test_an_aggregation_needs_its_normaliser():
    from tokengrad.objective.loss import register_aggregation

    with pytest.raises(TypeError, match="normaliser"):
        register_aggregation("half_mean")
