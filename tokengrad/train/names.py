"""The names in the registries a config key refers to, known without importing torch.

`tokengrad train --help` lists them and config validation checks a name (and a weighting rule's parameters)
against them before the trainer's modules are imported, so both answer at once instead of after seconds of
torch and transformers imports. BUILTIN is what each registry holds right after its module is imported
(tests/train/test_config.py asserts that it equals the real registries, so it cannot drift). Once a registry's
module is loaded, which anything registering into it must have done (a plugin's decorator is imported from
there), its live entries are read instead, so plugins' names count too.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping

# config key -> (module whose import fills the registry, the registry's name in it)
REGISTRIES = {
    "model": ("tokengrad.train.models", "MODELS"),
    "weighting": ("tokengrad.objective.weighting", "WEIGHTINGS"),
    "aggregation": ("tokengrad.objective.loss", "AGGREGATIONS"),
    "adv_scale": ("tokengrad.objective.advantages", "ADVANTAGE_SCALES"),
    "attribute_method": ("tokengrad.record.attribution.shares", "ATTRIBUTION_METHODS"),
    "rollout_correction": ("tokengrad.objective.rollout_correction", "MODES"),
}

# weighting rule -> the defaults of its keyword parameters (tokengrad.objective.weighting.rule_params)
_TR_GRPO = {"alpha": 2.0, "k": 9.0, "mu": 0.25, "lower": 1.0, "upper": 1.4, "placement": "loss"}
WEIGHTING_PARAMS: dict[str, dict] = {
    "ar": {"alpha": 0.3},
    "ar_lopti": {"alpha": 0.3, "eta": 0.5, "low_first": True},
    "clip_cov": {
        "fraction": 2e-4,
        "cov_low": 1.0,
        "cov_high": 5.0,
        "eps_low": 0.2,
        "eps_high": 0.2,
        "seed": None,
        "generator": None,
    },
    "cw_grpo": {},
    "grpo": {},
    "kl_cov": {"fraction": 2e-3, "kl_cov_coef": 1.0},
    "lopti": {"eta": 0.5, "low_first": True},
    "tr_grpo": _TR_GRPO,
    "tr_grpo_reverse": _TR_GRPO,
}

BUILTIN: dict[str, tuple[str, ...]] = {
    "model": ("lab-add", "lab-kk", "smollm2-135m-instruct", "tiny"),
    "weighting": tuple(WEIGHTING_PARAMS),
    "aggregation": ("dapo", "dr_grpo", "grpo"),
    "adv_scale": ("batch", "group", "none"),
    "attribute_method": ("central_difference", "jvp", "shard_difference"),
    "rollout_correction": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
}


def registered(key: str) -> Collection[str]:
    """The names registered for config key `key`: the live registry once its module is loaded, else the
    built-in names."""
    module, attr = REGISTRIES[key]
    loaded = sys.modules.get(module)
    return getattr(loaded, attr) if loaded is not None else BUILTIN[key]


def weighting_defaults(name: str) -> Mapping:
    """The defaults of a registered weighting rule's parameters (the rule's name is checked before)."""
    loaded = sys.modules.get(REGISTRIES["weighting"][0])
    return loaded.rule_params(name) if loaded is not None else WEIGHTING_PARAMS[name]
