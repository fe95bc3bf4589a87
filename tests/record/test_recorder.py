"""The recorder's numbers against brute-force autograd references (relative error <= 1e-4)."""

import math
import warnings

import pytest
import torch
from conftest import forward_logprobs

from tokengrad import Recorder, load_run
from tokengrad.record import Buckets

EPS_LOW, EPS_HIGH, BETA = 0.2, 0.28, 0.05


def ppo_kl_loss(lp, old, ref, adv, mask, weight=None):
    """PPO-clip with asymmetric clipping + beta * k3 KL, GRPO aggregation (sequence mean of token means)."""
    ratio = (lp - old).exp()  # [N, T]
    a = adv.unsqueeze(1)  # [N, 1]
    surr = torch.minimum(ratio * a, ratio.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * a)
    kl = (ref - lp).exp() - (ref - lp) - 1  # k3
    per_tok = -(surr) + BETA * kl
    if weight is not None:
        per_tok = per_tok * weight
    return ((per_tok * mask).sum(1) / mask.sum(1)).mean()


def _off_policy(lp, seed=3):
    g = torch.Generator().manual_seed(seed)
    old = lp.detach() + 0.3 * torch.randn(lp.shape, generator=g)  # ratios both inside and outside the clip
    ref = lp.detach() + 0.1 * torch.randn(lp.shape, generator=g)
    return old, ref


def test_coef_head_norm_and_grad_norm_match_autograd(tmp_path, tiny_model, batch):
    ids, mask, adv = batch
    with Recorder(tmp_path / "run", model=tiny_model) as rec, rec.step(0) as st:
        logits, lp, hidden, tgt = forward_logprobs(tiny_model, ids)
        old, ref = _off_policy(lp)
        loss = ppo_kl_loss(lp, old, ref, adv, mask)
        # reference first: every backward through a tracked tensor adds to its coef
        (coef_ref,) = torch.autograd.grad(loss, lp, retain_graph=True)
        st.track(
            lp,
            token_ids=tgt,
            mask=mask,
            old_logprobs=old,
            ref_logprobs=ref,
            advantages=adv,
            logits=logits,
            hidden=hidden,
        )
        st.backward(loss)
        total = st.record_grad_norms()
        clip_total = torch.nn.utils.clip_grad_norm_(tiny_model.parameters(), 1e9)
        st.log(loss=loss.item())
    assert total == pytest.approx(float(clip_total), rel=1e-5)
    tok = load_run(tmp_path / "run").tokens()
    m = mask.bool()
    assert len(tok) == int(m.sum())
    coef = torch.tensor(tok["coef"].to_numpy())
    assert torch.allclose(coef, coef_ref[m].float(), rtol=1e-4, atol=1e-9)
    ratio = (lp.detach() - old).exp()[m]
    assert torch.allclose(torch.tensor(tok["ratio"].to_numpy()), ratio, rtol=1e-5)

    # head_grad_norm: per-token autograd of coef_t * log p_t through a detached copy of the LM-head weight
    W = tiny_model.lm_head.weight.detach().clone().requires_grad_(True)
    h = hidden.detach()
    ref_norms = []
    for n, t in m.nonzero().tolist():
        lp_t = torch.log_softmax(h[n, t] @ W.T, -1)[tgt[n, t]]
        (g,) = torch.autograd.grad(coef_ref[n, t] * lp_t, W)
        ref_norms.append(g.norm())
    ref_norms = torch.stack(ref_norms)
    assert torch.allclose(
        torch.tensor(tok["head_grad_norm"].to_numpy()), ref_norms.float(), rtol=1e-4, atol=1e-10
    )
    # logit_grad_norm = |coef| * sqrt(1 - 2p + sum p^2)
    got = torch.tensor(tok["logit_grad_norm"].to_numpy())
    want = coef_ref[m].abs() * torch.tensor(tok["logit_grad_unit"].to_numpy())
    assert torch.allclose(got, want.float(), rtol=1e-5)


def _bucket_step(tmp_path, model, ids, mask, adv, entropy_coef=0.0):
    edges = (0.0, 0.02, 0.04, 1.0)  # a random tiny model puts p ~ 1/64: split around it
    with (
        Recorder(tmp_path / "b", model=model, buckets=Buckets(every=1, edges=edges)) as rec,
        rec.step(0) as st,
    ):
        logits, lp, _, tgt = forward_logprobs(model, ids)
        old, ref = _off_policy(lp)
        st.track(
            lp, token_ids=tgt, mask=mask, old_logprobs=old, ref_logprobs=ref, advantages=adv, logits=logits
        )
        loss = ppo_kl_loss(lp, old, ref, adv, mask)
        if entropy_coef:  # a term not built on log pi -> residual
            ent = -(torch.softmax(logits.float(), -1) * torch.log_softmax(logits.float(), -1)).sum(-1)
            loss = loss - entropy_coef * (ent * mask).sum() / mask.sum()
        st.backward(loss)
        st.record_grad_norms()
    return load_run(tmp_path / "b").buckets, edges, (lp.detach(), old, ref, tgt)


def test_bucket_gradients_match_masked_backward(tmp_path, tiny_model, batch):
    ids, mask, adv = batch
    buckets, edges, (lp0, old, ref, tgt) = _bucket_step(tmp_path, tiny_model, ids, mask, adv)
    rows = buckets[buckets.bucket != "residual"].reset_index(drop=True)
    assert rows["n_tokens"].sum() == int(mask.sum())
    assert rows["update_share"].sum() == pytest.approx(1.0, abs=1e-4)
    resid = buckets[buckets.bucket == "residual"].iloc[0]
    assert abs(resid["update_share"]) < 1e-4
    # reference: separate backward of the loss with the per-token terms masked to the bucket
    p = lp0.exp()
    for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
        in_b = ((p >= lo) & ((p < hi) | (hi == 1.0))).float() * mask
        tiny_model.zero_grad()
        _, lp, _, _ = forward_logprobs(tiny_model, ids)
        ratio = (lp - old).exp()
        a = adv.unsqueeze(1)
        per_tok = -torch.minimum(ratio * a, ratio.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * a) + BETA * (
            (ref - lp).exp() - (ref - lp) - 1
        )
        loss_b = ((per_tok * in_b).sum(1) / mask.sum(1)).mean()  # same denominators as the full loss
        loss_b.backward()
        gnorm = math.sqrt(
            sum(float(q.grad.pow(2).sum()) for q in tiny_model.parameters() if q.grad is not None)
        )
        assert rows.loc[i, "grad_norm"] == pytest.approx(gnorm, rel=1e-4)
        assert rows.loc[i, "n_tokens"] == int(in_b.sum())


def test_residual_from_terms_not_built_on_logprobs(tmp_path, tiny_model, batch):
    ids, mask, adv = batch
    buckets, _, _ = _bucket_step(tmp_path, tiny_model, ids, mask, adv, entropy_coef=0.5)
    shares = buckets["update_share"].sum()
    assert shares == pytest.approx(1.0, abs=1e-6)  # buckets + residual = 1 exactly
    resid = buckets[buckets.bucket == "residual"].iloc[0]
    assert abs(resid["update_share"]) > 1e-3  # the entropy bonus shows up as residual


def test_grad_accumulation_two_passes_one_update(tmp_path, tiny_model, batch):
    ids, mask, adv = batch
    with (
        Recorder(tmp_path / "ga", model=tiny_model, buckets=Buckets(every=1, edges=(0, 0.02, 1))) as rec,
        rec.step(0) as st,
    ):
        for half in (slice(0, 2), slice(2, 4)):  # two micro-batches
            logits, lp, _, tgt = forward_logprobs(tiny_model, ids[half])
            st.track(
                lp,
                token_ids=tgt,
                mask=mask[half],
                advantages=adv[half],
                logits=logits,
                sample_ids=torch.arange(4)[half],
                update_id=0,
            )
            st.backward(-(lp * adv[half, None] * mask[half]).sum() / mask.sum())
        total = st.record_grad_norms()
    run = load_run(tmp_path / "ga")
    assert set(run.tokens()["pass_id"]) == {0, 1}
    b = run.buckets
    assert b["update_share"].sum() == pytest.approx(1.0, abs=1e-5)
    assert b[b.bucket == "residual"]["grad_norm"].iloc[0] < 1e-6 * total
    assert run.steps["grad_norm"].iloc[0] == pytest.approx(total)
    assert run.steps["n_tokens"].iloc[0] == int(mask.sum()) == 8 * 4 - 3  # sample 1 is 3 tokens shorter


def test_scale_grad_changes_gradients_exactly_by_the_weights(tmp_path, batch):
    from conftest import make_model

    ids, mask, adv = batch
    w = torch.linspace(0.5, 1.5, 8).repeat(4, 1)  # [N, T]
    m1, m2 = make_model(seed=5), make_model(seed=5)
    with Recorder(tmp_path / "s", model=m1) as rec, rec.step(0) as st:
        _, lp, _, tgt = forward_logprobs(m1, ids)
        st.track(lp, token_ids=tgt, mask=mask, advantages=adv, scale_grad=w, weights=w)
        st.backward(-(lp * adv[:, None] * mask).sum() / mask.sum())
    _, lp2, _, _ = forward_logprobs(m2, ids)
    (-(lp2 * w * adv[:, None] * mask).sum() / mask.sum()).backward()
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-8)
    tok = load_run(tmp_path / "s").tokens()
    want = (-w * adv[:, None] / mask.sum())[mask.bool()]
    assert torch.allclose(torch.tensor(tok["coef"].to_numpy()), want, rtol=1e-5)


def test_nan_values_are_recorded_counted_and_warned(tmp_path, tiny_model, batch):
    ids, mask, adv = batch
    adv = adv.clone()
    adv[0] = float("nan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(tmp_path / "n", model=tiny_model) as rec, rec.step(0) as st:
            _, lp, _, tgt = forward_logprobs(tiny_model, ids)
            st.track(lp, token_ids=tgt, mask=mask, advantages=adv)
            st.backward(-(lp * adv[:, None] * mask).sum())
    run = load_run(tmp_path / "n")
    assert run.steps["n_nonfinite"].iloc[0] == 8 + 8  # advantage and coef of the 8 tokens of sample 0
    assert any("NaN/inf" in str(w.message) for w in caught)


def test_bad_inputs_raise_value_error_naming_the_tensor(tmp_path, tiny_model, batch):
    ids, mask, adv = batch
    with Recorder(tmp_path / "e", model=tiny_model) as rec, rec.step(0) as st:
        _, lp, _, tgt = forward_logprobs(tiny_model, ids)
        with pytest.raises(ValueError, match=r"mask has shape \(3, 8\)"):
            st.track(lp, token_ids=tgt, mask=mask[:3])
        with pytest.raises(ValueError, match="advantages has shape"):
            st.track(lp, token_ids=tgt, advantages=adv[:2])
        with pytest.raises(ValueError, match="token_ids must be an integer"):
            st.track(lp, token_ids=tgt.float())
        st.track(lp, token_ids=tgt, mask=mask, advantages=adv)  # a good call still works after bad ones
    assert len(load_run(tmp_path / "e").tokens()) == int(mask.sum())


def test_clip_grad_norm_matches_torch(tmp_path, batch):
    from conftest import make_model

    ids, mask, adv = batch
    m1, m2 = make_model(seed=7), make_model(seed=7)
    with Recorder(tmp_path / "c", model=m1) as rec, rec.step(0) as st:
        _, lp, _, tgt = forward_logprobs(m1, ids)
        st.track(lp, token_ids=tgt, mask=mask, advantages=adv)
        st.backward(-(lp * adv[:, None] * mask).sum())
        total = st.clip_grad_norm_(0.1)
    _, lp2, _, _ = forward_logprobs(m2, ids)
    (-(lp2 * adv[:, None] * mask).sum()).backward()
    ref = torch.nn.utils.clip_grad_norm_(m2.parameters(), 0.1)
    assert total == pytest.approx(float(ref), rel=1e-5) and total > 0.1
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-9)


def test_tokens_tracked_in_two_updates_count_once(tmp_path, tiny_model, batch):
    ids, mask, adv = batch
    with Recorder(tmp_path / "mu", model=tiny_model) as rec, rec.step(0) as st:
        for update_id in (0, 1):  # mu = 2 passes over one batch
            _, lp, _, tgt = forward_logprobs(tiny_model, ids)
            st.track(lp, token_ids=tgt, mask=mask, advantages=adv, update_id=update_id)
            st.backward(-(lp * adv[:, None] * mask).sum())
            st.record_grad_norms(update_id)
    run = load_run(tmp_path / "mu")
    assert len(run.tokens()) == 2 * 29 and run.steps["n_tokens"].iloc[0] == 29
    assert run.steps["n_updates"].iloc[0] == 2


def test_a_skipped_bucket_analysis_leaves_the_gradient_and_writes_no_bucket_gradients(
    tmp_path, tiny_model, batch
):
    """st.bucket_passes.skip (the trainer's step in which some rank has no rows): a scheduled
    bucket step records no bucket gradients, and its gradient is the plain backward's."""
    ids, mask, adv = batch
    norms = {}
    for skip in (False, True):
        tiny_model.zero_grad()
        with Recorder(tmp_path / str(skip), model=tiny_model, buckets=1) as rec, rec.step(0) as st:
            assert st.bucket_passes.scheduled
            if skip:
                st.bucket_passes.skip()
            assert st.bucket_passes.scheduled is not skip
            logits, lp, _, tgt = forward_logprobs(tiny_model, ids)
            st.track(lp, token_ids=tgt, mask=mask, advantages=adv, logits=logits)
            st.backward(-(lp * adv[:, None] * mask).sum() / mask.sum())
            norms[skip] = st.record_grad_norms()
        buckets = load_run(tmp_path / str(skip)).buckets
        assert len(buckets) == 0 if skip else buckets["grad_norm"].notna().all() and len(buckets) > 1
    assert norms[True] == pytest.approx(norms[False], rel=1e-6)


@pytest.mark.parametrize(
    "flat, grouped",
    [
        (dict(bucket_every=10), "buckets=Buckets(every=10)"),
        (dict(attribute_method="jvp"), "attribution=Attribution(method='jvp')"),
        (dict(token_budget=512), "budget=512"),
        (dict(run_name="a"), "info=RunInfo(name='a')"),
        (dict(on_error="raise"), "output=Output(on_error='raise')"),
    ],
)
def test_flat_keywords_of_earlier_releases_are_refused_with_their_grouped_form(tmp_path, flat, grouped):
    (key,) = flat
    with pytest.raises(TypeError) as err:
        Recorder(tmp_path / "r", **flat)
    assert str(err.value) == f"Recorder({key}=...) was removed: write Recorder({grouped})"
    with pytest.raises(TypeError, match=r"unexpected keyword\(s\) \['bucket_evry'\]"):
        Recorder(tmp_path / "r", bucket_evry=10)
    assert not (tmp_path / "r").exists()


def _scaled_step(path, model, batch, scale):
    """One bucket step of the PPO loss through a GradScaler of `scale` (None: no scaler), unscaled before
    the clip as torch's AMP recipe says; returns the run."""
    ids, mask, adv = batch
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale or 1.0, enabled=scale is not None)
    with (
        Recorder(path, model=model, buckets=Buckets(every=1, edges=(0.0, 0.5, 1.0))) as rec,
        rec.step(0) as st,
    ):
        _, lp, _, tgt = forward_logprobs(model, ids)
        old, ref = _off_policy(lp)
        st.track(lp, token_ids=tgt, mask=mask, old_logprobs=old, advantages=adv)
        loss = ppo_kl_loss(lp, old, ref, adv, mask)
        if scale is None:
            st.backward(loss)
        else:
            st.backward(scaler.scale(loss), loss_scale=scaler.get_scale())
            scaler.unscale_(opt)
        st.clip_grad_norm_(1e9)
        scaler.step(opt)
    model.zero_grad()
    return load_run(path)


def test_a_scaled_loss_records_the_unscaled_coef_norms_and_buckets(tmp_path, tiny_model, batch):
    """st.backward(scaler.scale(loss), loss_scale=...) under a GradScaler of 2^16: coef, the gradient
    norms and the bucket norms equal the unscaled run's (a power-of-two scale divides out exactly); the
    scale is logged as steps.loss_scale."""
    plain = _scaled_step(tmp_path / "plain", tiny_model, batch, None)
    scaled = _scaled_step(tmp_path / "scaled", tiny_model, batch, 2.0**16)
    assert scaled.steps.loss_scale.tolist() == [2.0**16] and plain.steps.loss_scale.isna().all()
    a, b = plain.tokens(), scaled.tokens()
    assert a.coef.abs().max() > 0
    torch.testing.assert_close(
        torch.tensor(b.coef.to_numpy()), torch.tensor(a.coef.to_numpy()), rtol=1e-6, atol=0
    )
    assert scaled.steps.grad_norm.tolist() == pytest.approx(plain.steps.grad_norm.tolist(), rel=1e-6)
    assert scaled.buckets.grad_norm.tolist() == pytest.approx(
        plain.buckets.grad_norm.tolist(), rel=1e-5, abs=1e-9
    )


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), "2"])
def test_a_bad_loss_scale_is_refused_by_name(tmp_path, tiny_model, bad):
    with Recorder(tmp_path / "r", model=tiny_model) as rec, rec.step(0) as st:
        with pytest.raises(ValueError, match="loss_scale must be a finite number > 0"):
            st.backward(torch.zeros((), requires_grad=True), loss_scale=bad)
