"""TRL under DeepSpeed: detection from accelerate's real DeepSpeedPlugin, the refusals, and (where DeepSpeed
runs on this CPU) per-block norms read through deepspeed.utils.safe_get_full_grad."""

from __future__ import annotations

import os

import pytest

from tokengrad.integrations import trl_deepspeed as tds

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed prints its accelerator guess to stdout otherwise
deepspeed = pytest.importorskip("deepspeed")
accelerate_utils = pytest.importorskip("accelerate.utils")


def _plugin(stage, **extra):
    cfg = {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": "auto",
           "gradient_accumulation_steps": 1, **extra}
    return accelerate_utils.DeepSpeedPlugin(hf_ds_config=cfg)


def _trainer_with(plugin):
    """What deepspeed_setup reads of a trainer: accelerator.state.deepspeed_plugin (a real plugin here)."""
    from types import SimpleNamespace as NS

    return NS(accelerator=NS(state=NS(deepspeed_plugin=plugin)))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_setup_is_read_from_the_plugin(stage):
    setup = tds.deepspeed_setup(_trainer_with(_plugin(stage, bf16={"enabled": True})))
    assert setup.zero_stage == stage and not setup.fp16
    assert setup.config["zero_optimization"]["stage"] == stage
    tds.check_deepspeed(setup, bucket_every=0)  # token columns, coef and norms: allowed


def test_no_deepspeed_is_none():
    assert tds.deepspeed_setup(_trainer_with(None)) is None
    tds.check_deepspeed(None, bucket_every=5)


@pytest.mark.parametrize("stage", [2, 3])
def test_bucket_analysis_is_refused(stage):
    setup = tds.deepspeed_setup(_trainer_with(_plugin(stage)))
    with pytest.raises(ValueError, match=rf"bucket_every=4.*ZeRO stage {stage}.*bucket_every=0"):
        tds.check_deepspeed(setup, bucket_every=4)


def test_fp16_loss_scaling_is_refused():
    setup = tds.deepspeed_setup(_trainer_with(_plugin(2, fp16={"enabled": True})))
    assert setup.fp16
    with pytest.raises(ValueError, match="loss scale.*bf16"):
        tds.check_deepspeed(setup, bucket_every=0)


@pytest.mark.trl
def test_attach_refuses_buckets_on_a_deepspeed_trainer(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from test_trl import make_trainer

    from tokengrad.integrations import trl as tg_trl

    trainer = make_trainer(tmp_path)
    setup = tds.deepspeed_setup(_trainer_with(_plugin(3)))
    monkeypatch.setattr(tg_trl, "deepspeed_setup", lambda t: setup)  # as accelerate would report it
    with pytest.raises(ValueError, match="not exact under DeepSpeed"):
        tg_trl.attach(trainer, tmp_path / "run", bucket_every=1)
    assert getattr(trainer, "_tokengrad_recording", None) is None
    assert not (tmp_path / "run").exists()
