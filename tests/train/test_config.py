"""tokengrad.train.config: flat TOML/YAML configs, key=value overrides, and clear errors before any work
starts."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tokengrad.train.config import (
    FIELDS,
    TrainConfig,
    describe_config,
    load_config,
    make_config,
    parse_override,
)

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.*"))


def test_defaults_are_valid_and_every_key_is_documented():
    cfg = make_config({})
    assert cfg == TrainConfig()
    assert all(f.metadata["doc"] for f in FIELDS.values())
    text = describe_config()
    assert all(f"  {name} = " in text for name in FIELDS)


def test_toml_file_and_typed_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        'model = "tiny"\ntask = "kk"\nsteps = 7\nlr = 3e-5\ntask_params = { n_people = [2, 3] }\n'
        'weighting = "ar"\nweighting_params = { alpha = 0.2 }\n'
    )
    cfg = load_config(
        path,
        [
            "steps=9",
            "bf16=false",
            "weighting_params.alpha=0.1",
            "task_params.data_seed=5",
            "eps_high=1",
            "run_name=123",
        ],
    )
    assert cfg.steps == 9 and cfg.lr == 3e-5 and cfg.bf16 is False
    assert cfg.weighting_params == {"alpha": 0.1}
    assert cfg.task_params == {"n_people": [2, 3], "data_seed": 5}
    assert cfg.eps_high == 1.0 and isinstance(cfg.eps_high, float)  # an int is accepted for a float key
    assert cfg.run_name == "123"  # string keys keep the raw text


def test_yaml_file_and_dict_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("task: countdown\naggregation: dr_grpo\nadv_scale: none\ngroup_size: 4\n")
    cfg = load_config(path, {"steps": 3, "weighting_params.alpha": 0.5, "weighting": "ar"})
    assert (cfg.task, cfg.aggregation, cfg.adv_scale, cfg.group_size, cfg.steps) == (
        "countdown",
        "dr_grpo",
        "none",
        4,
        3,
    )
    assert cfg.weighting_params == {"alpha": 0.5}


def test_parse_override_reads_toml_values_and_falls_back_to_text():
    assert parse_override("lr=1e-5") == ("lr", 1e-5)
    assert parse_override("dynamic_sampling=true") == ("dynamic_sampling", True)
    assert parse_override("task=kk") == ("task", "kk")
    assert parse_override("model=/some/dir") == ("model", "/some/dir")
    assert parse_override("task_params.n_people=[3, 4]") == ("task_params.n_people", [3, 4])
    with pytest.raises(ValueError, match="key=value"):
        parse_override("steps")


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"stepz": 3},
            r"unknown config key\(s\) 'stepz' \(did you mean 'steps'\?\); known keys: \['adv_scale'",
        ),
        ({"steps": 0}, r"config key 'steps' = 0: must be >= 1"),
        ({"group_size": 1}, r"config key 'group_size' = 1: must be >= 2"),
        ({"lr": "fast"}, r"config key 'lr' must be float, got str 'fast'"),
        ({"bf16": 1}, r"config key 'bf16' must be bool, got int 1"),
        ({"steps": 2.5}, r"config key 'steps' must be int, got float 2.5"),
        ({"steps": True}, r"config key 'steps' must be int, got bool True"),
        ({"top_p": 1.5}, r"config key 'top_p' = 1.5: must be in \(0, 1\]"),
        (
            {"weighting": "tr-grpo"},
            r"config key 'weighting' = 'tr-grpo': unknown name 'tr-grpo'; known: \['ar', 'ar_lopti'",
        ),
        ({"aggregation": "mean"}, r"unknown name 'mean'; known: \['dapo', 'dr_grpo', 'grpo'\]"),
        (
            {"task": "gsm8k"},
            r"config key 'task' = 'gsm8k': unknown name 'gsm8k'; known: \['arithmetic', .*'kk'",
        ),
        (
            {"model": "gpt-9"},
            r"config key 'model' = 'gpt-9': model must be one of "
            r"\['lab-add', 'lab-kk', 'smollm2-135m-instruct', 'tiny'\]",
        ),
        (
            {"weighting": "ar", "weighting_params": {"eta": 0.5}},
            r"'weighting_params': weighting rule 'ar' has no parameters \['eta'\]",
        ),
        ({"task_params": 3}, r"config key 'task_params' must be dict, got int 3"),
    ],
)
def test_bad_configs_name_the_key(values, message):
    with pytest.raises(ValueError, match=message):
        make_config(values)


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "c.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=r"must end in \.toml, \.yaml or \.yml"):
        load_config(bad)
    broken = tmp_path / "c.toml"
    broken.write_text("steps = = 3\n")
    with pytest.raises(ValueError, match="invalid TOML"):
        load_config(broken)
    with pytest.raises(ValueError, match=r"only \['task_params', 'weighting_params'\] take dotted keys"):
        load_config(None, ["steps.x=3"])


# Configs for a GPU whose `model` is a local checkpoint path the user supplies (checked with a stand-in).
USER_MODEL = {"kk_paper_ar_lopti.toml"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_example_configs_are_valid(path):
    if path.name in USER_MODEL:
        with pytest.raises(ValueError, match="config key 'model'"):
            load_config(path)
    cfg = load_config(path, {"model": "tiny"} if path.name in USER_MODEL else {})
    assert cfg.steps >= 1


def test_the_torch_free_names_equal_the_real_registries():
    """tokengrad.train.names lists every registry's built-in entries (and each rule's parameter defaults)
    for validation before torch is imported; it must hold exactly what the registries' modules register.
    Entries registered by test plugins (defined outside tokengrad) are left out of the comparison."""
    from tokengrad.objective.advantages import ADVANTAGE_SCALES
    from tokengrad.objective.loss import AGGREGATIONS
    from tokengrad.objective.rollout_correction import MODES
    from tokengrad.objective.weighting import WEIGHTINGS, rule_params
    from tokengrad.record.attribution.shares import ATTRIBUTION_METHODS
    from tokengrad.train import names
    from tokengrad.train.models import MODELS

    real = {
        "model": MODELS,
        "weighting": WEIGHTINGS,
        "aggregation": AGGREGATIONS,
        "adv_scale": ADVANTAGE_SCALES,
        "attribute_method": ATTRIBUTION_METHODS,
        "rollout_correction": MODES,
    }
    assert set(names.REGISTRIES) == set(names.BUILTIN) == set(real)
    for key, registry in real.items():
        module, attr = names.REGISTRIES[key]
        assert getattr(importlib.import_module(module), attr) is registry, key
        builtin = {n for n, entry in registry.items() if _defined_in_tokengrad(entry)}
        assert set(names.BUILTIN[key]) == builtin, key
        assert set(names.registered(key)) >= builtin  # the module is loaded: the live registry is read
    assert set(names.WEIGHTING_PARAMS) == set(names.BUILTIN["weighting"])
    assert {n: rule_params(n) for n in names.WEIGHTING_PARAMS} == names.WEIGHTING_PARAMS


def _defined_in_tokengrad(entry) -> bool:
    return getattr(entry, "__module__", "").startswith("tokengrad.")


def test_a_registered_plugin_name_passes_validation():
    """Once a plugin registers a rule, its name and its parameters are accepted (the live registry)."""
    from tokengrad.objective.weighting import WEIGHTINGS, register_weighting

    @register_weighting("half_weight_for_config_test", pointwise=True)
    def half(batch, scale: float = 0.5):
        raise AssertionError("never called by validation")

    try:
        cfg = make_config({"weighting": "half_weight_for_config_test", "weighting_params": {"scale": 0.25}})
        assert cfg.weighting_params == {"scale": 0.25}
        with pytest.raises(ValueError, match=r"scale='x' must be a number, like 0\.5"):
            make_config({"weighting": "half_weight_for_config_test", "weighting_params": {"scale": "x"}})
        assert "half_weight_for_config_test" in describe_config()
    finally:
        WEIGHTINGS.unregister("half_weight_for_config_test")
