"""fp16 with a gradient scaler under the TRL attach: accelerate backpropagates scaler.scale(loss) and
unscales in its clip, so coef and the gradient norms are read unscaled, and an update the scaler skips for
overflow is told apart from a non-finite model. No GPU here: accelerate's own fp16 path (autocast in
float16, GradScaler in backward, clip and optimizer step) is switched on for the CPU accelerator."""

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl")

from test_trl import make_trainer  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.doctor import diagnose  # noqa: E402
from tokengrad.integrations import trl as tg_trl  # noqa: E402
from tokengrad.record import Buckets  # noqa: E402

pytestmark = pytest.mark.trl


def fp16_trainer(path, init_scale: float, backoff: float = 0.5, **overrides):
    """A TRL trainer whose accelerator runs accelerate's fp16 path with a CPU GradScaler of `init_scale`
    (set before train(), so accelerate's prepare hands the scaler to the optimizer)."""
    trainer = make_trainer(path, "dapo", max_grad_norm=0.5, temperature=0.1, **overrides)
    acc = trainer.accelerator
    acc.scaler = torch.amp.GradScaler(
        "cpu", init_scale=init_scale, backoff_factor=backoff, growth_interval=10_000
    )
    acc.native_amp = True
    acc.__class__ = type("FP16Accelerator", (type(acc),), {"mixed_precision": "fp16"})
    return trainer


def _run(tmp_path, name, init_scale, **overrides):
    trainer = fp16_trainer(tmp_path / name, init_scale, **overrides)
    tg_trl.attach(trainer, tmp_path / name / "run", buckets=Buckets(every=1, edges=(0.0, 0.5, 1.0)))
    torch.manual_seed(0)
    trainer.train()
    logged = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    return load_run(tmp_path / name / "run"), logged


@pytest.mark.parametrize("own_clip", [True, False], ids=["shared-clip", "accelerates-clip"])
def test_coef_and_norms_are_recorded_unscaled(tmp_path, monkeypatch, own_clip):
    """The same run at loss scale 1 and 2^12: coef, the gradient norms and the bucket norms agree (fp16
    rounding apart), not by a factor 4096; the recorded norm is TRL's logged grad_norm. Also where
    accelerate's own clip runs (FSDP, say): it does not unscale the gradients a second time."""
    if not own_clip:
        from tokengrad.integrations.trl import clip

        monkeypatch.setattr(clip, "plain_clip", lambda *a: False)
    one, logged_one = _run(tmp_path, "one", 1.0)
    big, logged_big = _run(tmp_path, "big", 2.0**12)
    assert big.steps.loss_scale.tolist() == [2.0**12] * 2 and one.steps.loss_scale.tolist() == [1.0] * 2
    np.testing.assert_allclose(big.steps.grad_norm, logged_big, rtol=1e-6)  # TRL's own, after unscaling
    np.testing.assert_allclose(one.steps.grad_norm, logged_one, rtol=1e-6)
    np.testing.assert_allclose(big.steps.grad_norm, one.steps.grad_norm, rtol=2e-2)
    key = ["step", "sample_id", "position"]
    a, b = (r.tokens().sort_values(key).reset_index(drop=True) for r in (one, big))
    assert a.coef.abs().max() > 0
    np.testing.assert_allclose(b.coef, a.coef, rtol=2e-2, atol=1e-6)
    ba, bb = (r.buckets.sort_values(["step", "bucket"]).reset_index(drop=True) for r in (one, big))
    np.testing.assert_allclose(bb.grad_norm, ba.grad_norm, rtol=2e-2, atol=1e-7)
    assert (bb[bb.bucket == "residual"].grad_norm == 0.0).all()  # g minus the unscaled buckets: exact


def test_updates_the_scaler_skips_are_told_apart_from_a_nonfinite_model(tmp_path):
    """At 2^127 every gradient overflows (its norm reads inf or NaN): the scaler skips the update and
    backs off. Backing off by 2^-10 it recovers after one skip (info: the scaler calibrating); by 0.99 it
    skips every step (critical: no update is applied). Neither is reported as a non-finite model."""
    run, _ = _run(tmp_path, "recovers", 2.0**127, backoff=2.0**-10, max_steps=3)
    assert run.steps.loss_scale.tolist() == [2.0**127, 2.0**117, 2.0**117]
    assert not np.isfinite(run.steps.grad_norm[0]) and np.isfinite(run.steps.grad_norm[1:]).all()
    found = [f for f in diagnose(run.path) if f.id == "nonfinite"]
    assert [f.severity for f in found] == ["info"]
    assert "skipped 1 of 3" in found[0].message and "goes on" in found[0].message

    run, _ = _run(tmp_path, "stuck", 2.0**127, backoff=0.99, max_steps=6)
    assert not np.isfinite(run.steps.grad_norm).any()
    np.testing.assert_allclose(run.steps.loss_scale, [2.0**127 * 0.99**k for k in range(6)], rtol=1e-6)
    found = [f for f in diagnose(run.path) if f.id == "nonfinite"]
    assert [f.severity for f in found] == ["critical"]
    assert "skipped 6 of 6" in found[0].message and "no update is being applied" in found[0].message
