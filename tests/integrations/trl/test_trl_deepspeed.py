"""TRL under DeepSpeed: detection from accelerate's real DeepSpeedPlugin, the refusals, and (where DeepSpeed
runs on this CPU) norms read through deepspeed.utils.safe_get_full_grad from ZeRO-2/3
engines against the plain gradients of an identical model, and a TRL GRPOTrainer run on a ZeRO-2/3 engine.

The engine tests (marked slow) run in a pytest process of their own (scripts/test.sh): a ZeRO-3 engine
replaces torch.nn.functional.linear process-wide with an autograd function that has no forward-mode rule."""

from __future__ import annotations

import copy
import os
import socket

import pytest
import torch

from tokengrad.integrations.trl import deepspeed as tds
from tokengrad.record.gradnorms import grad_norms, trainable_params

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed prints its accelerator guess to stdout otherwise
deepspeed = pytest.importorskip("deepspeed")
accelerate_utils = pytest.importorskip("accelerate.utils")


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """A DeepSpeed trainer leaves accelerate's process-wide state (and transformers' DeepSpeed config) set:
    every later trainer in this process would start a DeepSpeed engine. Reset both after each test."""
    yield
    from accelerate.state import AcceleratorState, GradientState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    unset_hf_deepspeed_config()


def _plugin(stage, **extra):
    cfg = {
        "zero_optimization": {"stage": stage},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": 1,
        **extra,
    }
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
    with pytest.raises(ValueError, match=rf"buckets=4.*ZeRO stage {stage}.*buckets=0"):
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
        tg_trl.attach(trainer, tmp_path / "run", buckets=1)
    assert getattr(trainer, "_tokengrad_recording", None) is None
    assert not (tmp_path / "run").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ds_group():
    """A one-process gloo group for DeepSpeed on CPU (its first use compiles DeepSpeed's CPU comm op)."""
    env = dict(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    deepspeed.init_distributed(dist_backend="gloo")
    yield
    torch.distributed.destroy_process_group()
    for k, v in old.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_full_grad_norms_through_deepspeed_equal_plain_gradients(ds_group, stage):
    from conftest import make_model

    model = make_model()
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1e-3,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    engine.backward(engine(ids).logits.float().logsumexp(-1).mean())
    total, blocks = tds.full_grad_norms(engine.module)  # after backward, before step: DeepSpeed's window
    ref(ids).logits.float().logsumexp(-1).mean().backward()
    want_total, want_blocks = grad_norms(trainable_params(ref))
    assert total == pytest.approx(want_total, rel=1e-5)
    assert blocks.keys() == want_blocks.keys() and len(blocks) > 2
    for b in blocks:
        assert blocks[b] == pytest.approx(want_blocks[b], rel=1e-5, abs=1e-9), b
    engine.step()  # clips to 1e-3: DeepSpeed's own norm is the pre-clip one
    assert float(engine.get_global_grad_norm()) == pytest.approx(want_total, rel=1e-5)


@pytest.mark.slow
@pytest.mark.trl
@pytest.mark.parametrize("stage", [2, 3])
def test_trl_grpo_under_deepspeed_records_exact_norms(ds_group, tmp_path, stage):
    """A real GRPOTrainer whose accelerator runs a DeepSpeed ZeRO engine: per-block norms through
    safe_get_full_grad inside engine.step equal DeepSpeed's own pre-clip global norm."""
    pytest.importorskip("trl")
    from test_trl import make_trainer

    from tokengrad import load_run
    from tokengrad.integrations import trl as tg_trl

    ds_cfg = {
        "zero_optimization": {"stage": stage},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }
    trainer = make_trainer(tmp_path, deepspeed=ds_cfg, use_cpu=False, max_grad_norm=1e-3)
    assert tds.deepspeed_setup(trainer).zero_stage == stage
    tg_trl.attach(trainer, tmp_path / "run")
    trainer.train()
    run = load_run(tmp_path / "run")
    steps = run.steps
    assert run.meta["config"]["deepspeed"]["zero_stage"] == stage
    assert steps["ds_grad_norm"].notna().all() and (steps["ds_grad_norm"] > 1e-3).all()
    assert steps["grad_norm"].to_numpy() == pytest.approx(steps["ds_grad_norm"].to_numpy(), rel=1e-5)
    layers = run.table("layers")
    assert {"total", "model.layers.0"} <= set(layers["layer"])
    assert len(run.tokens()) > 0 and run.tokens()["coef"].notna().all()
