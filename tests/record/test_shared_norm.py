"""One read of the gradients for the recorded norms and for clipping: `st.clip_grad_norm_` leaves the
gradients bitwise as `torch.nn.utils.clip_grad_norm_` does; and a bucket whose tokens all have coef 0
gets no backward pass and the rows a zero gradient gives."""

import pytest
import torch
from conftest import forward_logprobs, make_model

from tokengrad import Recorder, load_run, schema
from tokengrad.record import Buckets
from tokengrad.record.gradnorms import clip_with_norm_, grad_norms_for_clip, trainable_params


def _grads(model, ids, mask, adv):
    _, lp, _, tgt = forward_logprobs(model, ids)
    return lp, tgt, -(lp * adv[:, None] * mask).sum()


@pytest.mark.parametrize("max_norm", [0.05, 1e6])  # clipped, and a factor clamped to exactly 1
def test_clip_grad_norm_is_bitwise_torchs(tmp_path, batch, max_norm):
    ids, mask, adv = batch
    m1, m2 = make_model(seed=7), make_model(seed=7)
    with Recorder(tmp_path / "c", model=m1) as rec, rec.step(0) as st:
        lp, tgt, loss = _grads(m1, ids, mask, adv)
        st.track(lp, token_ids=tgt, mask=mask, advantages=adv)
        st.backward(loss)
        total = st.clip_grad_norm_(max_norm)
    _grads(m2, ids, mask, adv)[2].backward()
    before = [p.grad.clone() for p in m2.parameters()]
    ref = torch.nn.utils.clip_grad_norm_(m2.parameters(), max_norm)
    assert total == pytest.approx(float(ref), rel=1e-6)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(m1.parameters(), m2.parameters()))
    if max_norm > float(ref):  # torch multiplied by 1.0: the gradients are the unclipped ones
        assert all(torch.equal(a, b.grad) for a, b in zip(before, m2.parameters()))
    else:
        assert float(ref) > max_norm and not torch.equal(before[0], m2.parameters().__next__().grad)


def test_clip_total_is_torchs_and_mixed_dtypes_give_none(batch):
    ids, mask, adv = batch
    model = make_model(seed=2)
    _grads(model, ids, mask, adv)[2].backward()
    named = trainable_params(model)
    total, blocks, clip_total = grad_norms_for_clip(named)
    want = torch.nn.utils.get_total_norm([p.grad for _, p in named])
    assert torch.equal(clip_total, want) and total == pytest.approx(float(want), rel=1e-6)
    assert sum(v * v for v in blocks.values()) == pytest.approx(total * total, rel=1e-9)
    half = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    half.grad = torch.ones(3, dtype=torch.bfloat16)  # torch would group it apart: no shared total
    assert grad_norms_for_clip([*named, ("extra.weight", half)])[2] is None


def test_clip_with_norm_scales_like_torch_and_nan_poisons():
    g1, g2 = torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.0])
    clip_with_norm_([g1], 1.0, torch.tensor(5.0))
    torch.nn.utils.clip_grads_with_norm_([torch.nn.Parameter(torch.zeros(2))], 1.0, torch.tensor(5.0))
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = g2
    torch.nn.utils.clip_grads_with_norm_([p], 1.0, torch.tensor(5.0))
    assert torch.equal(g1, p.grad) and g1.tolist() == pytest.approx([0.6, 0.8], rel=1e-6)
    g3 = torch.tensor([1.0, 2.0])
    clip_with_norm_([g3], 1.0, torch.tensor(float("nan")))  # torch scales by NaN too
    assert torch.isnan(g3).all()


def test_zero_coef_bucket_is_skipped_and_rows_unchanged(tmp_path, batch, monkeypatch):
    """Half the sequences have advantage 0: the bucket holding only their tokens gets no backward pass."""
    import tokengrad.record.buckets.analysis as bk

    ids, mask, _ = batch
    adv = torch.tensor([1.0, 0.0, 0.0, -1.5])
    edges = (0.0, 0.5, 1.0)

    def run(name):
        model = make_model(seed=5)
        with Recorder(tmp_path / name, model=model, buckets=Buckets(every=1, edges=edges)) as rec:
            with rec.step(0) as st:
                lp, tgt, loss = _grads(model, ids, mask, adv)
                # a probability per token that puts rows 1 and 2 (A = 0) alone in the upper bucket
                prob = torch.where(adv[:, None] == 0, 0.9, 0.1).expand_as(lp).contiguous()
                monkeypatch.setattr(bk, "bucket_index", lambda p, e: (prob > 0.5).long())
                st.track(lp, token_ids=tgt, mask=mask, advantages=adv)
                st.backward(loss)
                st.record_grad_norms()
        return load_run(tmp_path / name).buckets.sort_values("bucket").reset_index(drop=True)

    calls = []
    grad = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: calls.append(1) or grad(*a, **k))
    rows = run("skip")
    # the bucket with non-zero coef is derived as g minus the others (a residual-free update) and the
    # zero-coef bucket is skipped: no pass at all
    assert len(calls) == 0
    upper = rows[rows.bucket == schema.bucket_label(0.5, 1.0)].iloc[0]
    assert upper.n_tokens == int(mask[1:3].sum()) and upper.grad_norm == 0.0 and upper.update_share == 0.0
    lower = rows[rows.bucket == schema.bucket_label(0.0, 0.5)].iloc[0]
    assert lower.update_share == pytest.approx(1.0, abs=1e-6)  # the whole update: A != 0 rows only
    resid = rows[rows.bucket == "residual"].iloc[0]
    assert abs(resid.update_share) < 1e-6
