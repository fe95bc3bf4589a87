"""The doctor's settings view takes whose run it is from meta_file.origin (the dashboard's definition), and
maps each producer's config, the verl plugin's included, to one RunSettings."""

from __future__ import annotations

import pytest

from tokengrad.doctor.settings import PRODUCERS, producer, settings_of
from tokengrad.read import meta_file

METAS = [
    {"config": {"integration": "trl", "args": {"max_completion_length": 16}}},
    {"config": {"integration": "verl", "loss_mode": "tokengrad"}},
    {"config": {"task": "letters", "prompts_per_step": 2, "group_size": 4, "bucket_every": 5}},
    # a loop that names the trainer's settings but is no TrainConfig: the two definitions once disagreed
    {"config": {"task": "math", "group_size": 4, "max_new_tokens": 32, "aggregation": "token"}},
    {"config": {"lr": 1e-3}},
    {},
]


def test_producer_is_meta_files_origin():
    got = [settings_of(m).producer for m in METAS]
    assert got == [meta_file.origin(m) for m in METAS] == ["trl", "verl", "trainer", "loop", "loop", "loop"]
    assert set(PRODUCERS) == set(meta_file.ORIGINS)  # every origin maps its config
    # the loop above still gets its settings, by the common names
    s = settings_of(METAS[3])
    assert (s.max_new_tokens, s.group_size, s.loss_type) == (32, 4, "token")


def test_a_producer_must_be_an_origin():
    with pytest.raises(ValueError, match="meta_file.ORIGINS"):
        producer("recorder")


def test_verl_settings_from_what_the_plugin_records():
    """The keys tokengrad.integrations.verl.settings.run_config writes (verl's names) and the temperature
    the plugin puts into meta.json."""
    cfg = {
        "integration": "verl",
        "loss_mode": "tokengrad",
        "loss_agg_mode": "seq-mean-token-mean",
        "rollout_n": 8,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "ppo_epochs": 2,
        "use_kl_loss": True,
        "kl_loss_coef": 0.001,
        "response_length": 1024,
    }
    s = settings_of({"config": cfg, "temperature": 0.7})
    assert s.producer == "verl" and s.max_new_tokens == 1024 and s.group_size == 8
    assert s.loss_type == "seq-mean-token-mean" and (s.eps_low, s.eps_high) == (0.2, 0.28)
    assert s.num_iterations == 2 and s.beta == 0.001 and s.temperature == 0.7
    # without the actor's KL loss beta is unknown (a KL in the reward is outside the loss seam); verl's
    # v1 trainer gives no response length: the length limit stays unknown
    s = settings_of({"config": {**cfg, "use_kl_loss": False, "response_length": None}})
    assert s.beta is None and s.max_new_tokens is None and s.temperature is None
