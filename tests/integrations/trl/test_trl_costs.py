"""The costs of the TRL attach: its clip reuses the norm it records (no second read of .grad, parameters
bitwise as TRL alone leaves them) and a bucket step of a loss built only on log pi derives one bucket."""

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl")

from test_trl import make_trainer  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import trl as tg_trl  # noqa: E402
from tokengrad.record import Buckets  # noqa: E402

pytestmark = pytest.mark.trl


def _train(tmp_path, name, monkeypatch, attach: bool):
    trainer = make_trainer(tmp_path / name, "dapo", max_steps=1, max_grad_norm=0.5, temperature=0.1)
    if attach:
        tg_trl.attach(trainer, tmp_path / name / "run", buckets=Buckets(every=1, edges=(0.0, 0.5, 1.0)))
    clips, passes = [], []
    norm, grad = torch.nn.utils.get_total_norm, torch.autograd.grad
    monkeypatch.setattr(torch.nn.utils, "get_total_norm", lambda *a, **k: clips.append(1) or norm(*a, **k))
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: passes.append(1) or grad(*a, **k))
    torch.manual_seed(0)
    trainer.train()
    monkeypatch.undo()
    params = [p.detach().clone() for p in trainer.model.parameters()]
    return params, len(clips), len(passes), trainer.state.log_history


def test_trl_clip_shares_the_recorded_norm_and_a_bucket_is_derived(tmp_path, monkeypatch):
    plain, plain_clips, _, plain_logs = _train(tmp_path, "plain", monkeypatch, attach=False)
    ours, our_clips, n_passes, logs = _train(tmp_path, "ours", monkeypatch, attach=True)
    assert plain_clips == 1 and our_clips == 0  # accelerate never read .grad again: the recorded norm clipped
    norms = [h["grad_norm"] for h in logs if "grad_norm" in h]
    assert norms == [h["grad_norm"] for h in plain_logs if "grad_norm" in h] and max(norms) > 0.5
    assert all(torch.equal(a, b) for a, b in zip(ours, plain))  # bitwise TRL's clip and update
    b = load_run(tmp_path / "ours" / "run").buckets
    assert (b[b.bucket == "residual"].grad_norm == 0.0).all()  # derived: exactly no residual
    assert n_passes == 1  # one update, two buckets: one pass
    assert b.update_share.sum() == pytest.approx(1.0, abs=1e-5)


def test_bucket_activations_turns_checkpointing_off_on_bucket_steps_only(tmp_path):
    """attach(bucket_activations=True): the loss's forward on a bucket step runs without gradient
    checkpointing (its passes recompute no layer), other steps with it; the bucket rows are unchanged."""
    rows, seen = {}, {}
    for kept in (False, True):
        trainer = make_trainer(
            tmp_path / str(kept), "dapo", max_steps=2, temperature=0.1, gradient_checkpointing=True
        )
        tg_trl.attach(trainer, tmp_path / str(kept) / "run", buckets=2, bucket_activations=kept)
        seen[kept] = []

        def spy(model, args, _seen=seen[kept]):  # forwards with grad: the loss's, one per step here
            if torch.is_grad_enabled():
                _seen.append(model.is_gradient_checkpointing)

        trainer.model.register_forward_pre_hook(spy)
        torch.manual_seed(0)
        trainer.train()
        assert trainer.model.is_gradient_checkpointing  # restored after every bucket step
        rows[kept] = load_run(tmp_path / str(kept) / "run").buckets
    assert seen[False] == [True, True] and seen[True] == [False, True]  # step 0 is the bucket step
    np.testing.assert_allclose(rows[True].grad_norm, rows[False].grad_norm, rtol=1e-5)
    np.testing.assert_allclose(rows[True].update_share, rows[False].update_share, rtol=1e-5, atol=1e-7)
