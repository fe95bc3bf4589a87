"""What-if updates in the built-in trainer (config keys `whatif`, `whatif_every`): the whatif row of a rule
on a GRPO run equals the real run of that rule at step 0 (the same state and batch), both ways."""

from __future__ import annotations

import pytest
from letters_task import LettersTask  # noqa: F401  (registers the "letters" task)
from test_training_math import tiny

from tokengrad import load_run
from tokengrad.train.config import make_config
from tokengrad.train.trainer import train

# TR-GRPO with k = 300: w(p) rises from 1 at p = ln 3 / 300 = 0.0037, so that the tiny model's tokens
# (p ~ 0.004) get weights above 1
TR = "tr_grpo:k=300.0"


def _run(tmp_path, name, weighting: str, whatif: str):
    params = {"k": 300.0} if weighting == "tr_grpo" else {}
    cfg = tiny(tmp_path, name, weighting=weighting, weighting_params=params, whatif=[whatif], whatif_every=1)
    return load_run(train(cfg))


def test_whatif_rows_equal_the_real_run_of_the_rule(tmp_path):
    grpo = _run(tmp_path, "grpo", "grpo", TR)
    tr = _run(tmp_path, "tr", "tr_grpo", "grpo")
    norm = {r: float(run.steps.grad_norm.iloc[0]) for r, run in (("grpo", grpo), ("tr", tr))}
    assert norm["grpo"] != pytest.approx(norm["tr"], rel=1e-3)  # the rules differ on this batch
    for run, rule, real in ((grpo, TR, norm["tr"]), (tr, "grpo", norm["grpo"])):
        w = run.table("whatif")
        row = w[(w.rule == rule) & (w.bucket == "all")].iloc[0]
        assert row.grad_norm == pytest.approx(real, rel=1e-4)
        assert run.meta["whatif_rules"] == [rule]


def test_config_keys_are_checked_and_regrouped():
    cfg = make_config({"whatif": ["tr_grpo:alpha=0.5", "upper=1.8", "lopti"]})  # as a command line splits
    assert cfg.whatif == ["tr_grpo:alpha=0.5,upper=1.8", "lopti"]
    with pytest.raises(ValueError, match="config key 'whatif': unknown weighting rule 'tr'; known rules"):
        make_config({"whatif": ["tr"]})
    with pytest.raises(ValueError, match="config key 'whatif': weighting rule 'ar' has no parameters"):
        make_config({"whatif": ["ar:eta=1"]})
