"""What-if updates inside TRL (`attach(..., whatif=...)`): the rules are evaluated with TRL's own loss
settings, so rule "grpo" on a plain TRL run is TRL's actual update, and TR-GRPO's row equals a real TRL run
with weighting="tr_grpo" from the same state and batch; losses the rules cannot stand for are refused."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from test_trl import make_trainer  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import trl as tg_trl  # noqa: E402
from tokengrad.record import WhatIf  # noqa: E402

pytestmark = pytest.mark.trl


def _total(run) -> float:
    layers = run.layers
    return float(layers[layers.layer == "total"].grad_norm.iloc[0])


def _row(run, rule: str):
    w = run.table("whatif")
    return w[(w.rule == rule) & (w.bucket == "all")].iloc[0]


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_grpo_rule_is_trls_own_update(tmp_path, loss_type):
    # temperature 0.1 sharpens the tiny model so token probabilities span TR-GRPO's rising range
    trainer = make_trainer(tmp_path, loss_type, max_steps=1, temperature=0.1, max_grad_norm=0.5)
    tg_trl.attach(trainer, tmp_path / "run", whatif=WhatIf(rules=["grpo", "tr_grpo"], every=1))
    trainer.train()
    run = load_run(tmp_path / "run")
    row = _row(run, "grpo")
    assert row.grad_norm == pytest.approx(_total(run), rel=1e-4)
    assert row.cos_to_actual == pytest.approx(1.0, abs=1e-5)
    assert row.would_clip == bool(row.grad_norm > 0.5)
    if loss_type == "dapo":  # the other way: a real TR-GRPO run from the same state and batch
        real_trainer = make_trainer(
            tmp_path / "tr", loss_type, max_steps=1, temperature=0.1, max_grad_norm=0.5
        )
        tg_trl.attach(real_trainer, tmp_path / "tr_run", weighting="tr_grpo")
        real_trainer.train()
        real = _total(load_run(tmp_path / "tr_run"))
        assert _row(run, "tr_grpo").grad_norm == pytest.approx(real, rel=1e-4)
        assert real != pytest.approx(_total(run), rel=1e-3)


def test_a_rule_name_alone_records_every_ten_steps(tmp_path):
    trainer = make_trainer(tmp_path, "dapo", max_steps=1)
    rec = tg_trl.attach(trainer, tmp_path / "run", whatif="tr_grpo:alpha=3.0")
    assert rec.recorder.whatif.every == 10 and rec.recorder.whatif.labels() == ["tr_grpo:alpha=3.0"]
    assert rec.recorder.whatif.loss["aggregation"] == "dapo"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(loss_type="cispo"), "TRL loss_type 'cispo' is another loss"),
        (dict(importance_sampling_level="sequence"), "needs importance_sampling_level='token'"),
    ],
)
def test_losses_the_rules_cannot_stand_for_are_refused(tmp_path, overrides, message):
    trainer = make_trainer(tmp_path, **overrides)
    with pytest.raises(ValueError, match=message):
        tg_trl.attach(trainer, tmp_path / "run", whatif=WhatIf(rules=["tr_grpo"], every=1))
    assert not (tmp_path / "run").exists()
