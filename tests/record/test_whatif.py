"""What-if updates (buckets/whatif.py): the whatif row of rule R on a run trained with rule A equals a real
run with rule R from the same state and batch, both ways, per bucket too; Lopti's phases; bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import forward_logprobs, make_model

from tokengrad import load_run
from tokengrad.objective.loss import phase_masks, policy_loss
from tokengrad.objective.weighting import TokenBatch, get_weighting
from tokengrad.record.buckets.whatif import WhatIf
from tokengrad.record.recorder import Recorder

REL = 1e-4


def _model(seed: int):
    """The tiny Llama with its (tied) embeddings scaled up: probabilities spread over [0, 1], so the rules'
    weights and every probability bucket come into play."""
    model = make_model(seed=seed)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(7.5)
    return model


@torch.no_grad()
def _batch(model):
    """Six completions of 9 tokens sampled from `model` (so that their probabilities spread), a mask,
    advantages [N] and a perturbation of log pi_old."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (6, 1), generator=g)  # [N, 1] first tokens
    for _ in range(9):
        probs = model(ids).logits[:, -1].softmax(-1)  # [N, V]
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g)], 1)
    mask = torch.ones(6, 9)
    mask[2, 6:] = 0
    adv = torch.tensor([1.0, -0.5, 0.25, -1.5, 0.75, 0.0])  # [N]
    # off-policy old log-probs so that the ratio and the clip differ between rules
    noise = 0.3 * torch.randn(6, 9, generator=g)  # [N, T]
    return ids, mask, adv, noise


def _train(run_dir, model, rule: str, *, whatif=None, micro=1, aggregation="grpo"):
    """One step of rule `rule` (Lopti: its updates) on the fixed batch; returns the run."""
    ids, mask, adv, noise = _batch(model)
    rows = torch.arange(len(ids)).chunk(micro)
    with Recorder(run_dir, model=model, buckets=1, whatif=whatif) as rec, rec.step(0) as st:
        with torch.no_grad():
            old = forward_logprobs(model, ids)[1] + noise  # [N, T]
        weighting = get_weighting(rule)
        phases = phase_masks(
            weighting(TokenBatch(logprobs=old, old_logprobs=old, advantages=adv, mask=mask)), mask
        )
        for uid, phase in enumerate(phases):
            for r in rows:
                _, lp, _, tgt = forward_logprobs(model, ids[r])
                w = weighting(TokenBatch(logprobs=lp, old_logprobs=old[r], advantages=adv[r], mask=mask[r]))
                out = policy_loss(lp, old[r], adv[r], phase[r], w, loss_mask=mask[r], aggregation=aggregation)
                share = mask[r].sum() / mask.sum() if aggregation == "dapo" else len(r) / len(ids)
                st.track(
                    lp,
                    token_ids=tgt,
                    mask=mask[r],
                    loss_mask=phase[r],
                    old_logprobs=old[r],
                    advantages=adv[r],
                    sample_ids=r,
                    update_id=uid,
                )
                st.backward(out.loss * share)
            st.record_grad_norms(uid)
            model.zero_grad(set_to_none=True)  # every update from the same parameters: no optimizer step
    return load_run(run_dir)


def _whatif_all(run, rule: str, update_id: int = 0, phase: int = 0):
    w = run.table("whatif")
    sel = w[(w.rule == rule) & (w.bucket == "all") & (w.update_id == update_id) & (w.phase == phase)]
    assert len(sel) == 1
    return sel.iloc[0]


def _real_norm(run, update_id: int = 0) -> float:
    layers = run.layers
    return float(layers[(layers.layer == "total") & (layers.update_id == update_id)].grad_norm.iloc[0])


@pytest.mark.parametrize(
    ("actual", "other", "micro", "aggregation"),
    [("grpo", "tr_grpo", 1, "grpo"), ("tr_grpo", "grpo", 2, "dapo")],  # both ways; micro-batches too
)
def test_whatif_equals_a_real_run_of_the_other_rule(tmp_path, actual, other, micro, aggregation):
    model = _model(5)
    twin = copy.deepcopy(model)
    wi = WhatIf(rules=[other], every=1, loss={"aggregation": aggregation})
    ran = _train(tmp_path / "a", model, actual, whatif=wi, micro=micro, aggregation=aggregation)
    real = _train(tmp_path / "r", twin, other, micro=micro, aggregation=aggregation)
    row = _whatif_all(ran, other)
    assert row.grad_norm == pytest.approx(_real_norm(real), rel=REL)
    assert row.grad_norm != pytest.approx(_real_norm(ran), rel=1e-3)  # the rules do differ on this batch
    buckets = real.buckets[real.buckets.bucket != "residual"].set_index("bucket")
    w = ran.table("whatif")
    per_bucket = w[(w.rule == other) & (w.bucket != "all")].set_index("bucket")
    assert per_bucket.update_share.sum() == pytest.approx(1.0, rel=1e-6)
    for b, r in per_bucket.iterrows():
        assert r.n_tokens == buckets.loc[b, "n_tokens"]
        assert r.grad_norm == pytest.approx(buckets.loc[b, "grad_norm"], rel=REL, abs=1e-9)
        if buckets.loc[b, "n_tokens"]:
            assert r.update_share == pytest.approx(buckets.loc[b, "update_share"], rel=REL, abs=1e-7)


def test_cosine_and_projection_against_the_actual_gradient(tmp_path):
    """cos_to_actual and update_share of the 'all' row, from both runs' gradients by hand."""
    model = _model(6)
    ids, mask, adv, noise = _batch(model)
    grads = {}
    for rule in ("grpo", "tr_grpo"):
        m = copy.deepcopy(model)
        with torch.no_grad():
            old = forward_logprobs(m, ids)[1] + noise
        _, lp, _, _ = forward_logprobs(m, ids)
        w = get_weighting(rule)(TokenBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask))
        policy_loss(lp, old, adv, mask, w).loss.backward()
        grads[rule] = torch.cat([p.grad.reshape(-1) for p in m.parameters()]).double()
    run = _train(tmp_path / "a", model, "grpo", whatif=WhatIf(rules=["tr_grpo"], every=1))
    row = _whatif_all(run, "tr_grpo")
    g, g_r = grads["grpo"], grads["tr_grpo"]
    assert row.cos_to_actual == pytest.approx(float(g @ g_r / (g.norm() * g_r.norm())), rel=REL)
    assert row.update_share == pytest.approx(float(g @ g_r / (g @ g)), rel=REL)
    assert row.n_tokens == int(mask.sum())


def test_the_real_update_is_untouched(tmp_path):
    """.grad and the recorded norms are the same with and without what-if updates, and coef too."""
    a, b = _model(7), _model(7)
    with_wi = _train(tmp_path / "a", a, "grpo", whatif=WhatIf(rules=["tr_grpo", "ar"], every=1))
    plain = _train(tmp_path / "b", b, "grpo")
    assert _real_norm(with_wi) == _real_norm(plain)
    ca = with_wi.tokens(columns=["coef"]).coef.to_numpy()
    cb = plain.tokens(columns=["coef"]).coef.to_numpy()
    assert (ca == cb).all()


def test_lopti_phases_at_the_same_parameters(tmp_path):
    """Lopti's first phase equals a real Lopti run's first update; both phases sum to GRPO's gradient
    (the phases partition the tokens and each is normalised over the whole mask)."""
    model = _model(8)
    twin = copy.deepcopy(model)
    run = _train(
        tmp_path / "a", model, "grpo", whatif=WhatIf(rules=["lopti", "grpo"], every=1, buckets=False)
    )
    real = _train(tmp_path / "r", twin, "lopti")  # both updates from the same parameters (no optimizer step)
    for phase in (0, 1):
        assert _whatif_all(run, "lopti", phase=phase).grad_norm == pytest.approx(
            _real_norm(real, phase), rel=REL
        )
    w = run.table("whatif")
    assert set(w.bucket) == {"all"}  # buckets=False: one backward per rule and phase, no bucket rows
    lo, hi, grpo = (_whatif_all(run, r, phase=k) for r, k in (("lopti", 0), ("lopti", 1), ("grpo", 0)))
    assert lo.n_tokens + hi.n_tokens == grpo.n_tokens
    # <g_lo + g_hi, g> = <g, g> for the actual GRPO gradient g: the projections sum to 1
    assert lo.update_share + hi.update_share == pytest.approx(1.0, rel=REL)
    assert grpo.update_share == pytest.approx(1.0, rel=REL) and grpo.cos_to_actual == pytest.approx(
        1.0, rel=REL
    )


def test_rule_parameters_and_labels(tmp_path):
    wi = WhatIf(
        rules=["tr_grpo:alpha=3.0,upper=1.8", {"name": "ar", "alpha": 0.5}], every=2, max_grad_norm=0.01
    )
    assert wi.labels() == ["tr_grpo:alpha=3.0,upper=1.8", "ar:alpha=0.5"]
    run = _train(tmp_path / "a", _model(9), "grpo", whatif=wi)
    w = run.table("whatif")
    assert sorted(set(w.rule)) == ["ar:alpha=0.5", "tr_grpo:alpha=3.0,upper=1.8"]
    alls = w[w.bucket == "all"]
    assert alls.would_clip.tolist() == [bool(n > 0.01) for n in alls.grad_norm] and alls.would_clip.all()
    assert run.meta["whatif_rules"] == wi.labels() and run.meta["whatif_every"] == 2


def test_steps_off_schedule_have_no_rows(tmp_path):
    model = _model(4)
    ids, mask, adv, _ = _batch(model)
    with Recorder(tmp_path / "r", model=model, whatif=WhatIf(rules=["tr_grpo"], every=2)) as rec:
        for step in range(3):
            with rec.step(step) as st:
                _, lp, _, tgt = forward_logprobs(model, ids)
                st.track(lp, token_ids=tgt, mask=mask, old_logprobs=lp.detach(), advantages=adv)
                st.backward(policy_loss(lp, lp.detach(), adv, mask).loss)
                st.record_grad_norms()
                model.zero_grad()
    assert sorted(set(load_run(tmp_path / "r").table("whatif").step)) == [0, 2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(rules=["nope"], every=1), "unknown weighting rule 'nope'; known rules: ar, ar_lopti"),
        (dict(rules=["tr_grpo:alfa=1"], every=1), "has no parameters ['alfa']"),
        (dict(rules=["tr_grpo:alpha"], every=1), "is not key=value"),
        (dict(rules=["ar", "ar"], every=1), "given twice"),
        (dict(rules=[], every=1), "needs rules=[...]"),
        (dict(rules=["ar"], every="2"), "whatif.every must be an integer"),
        (dict(rules=["ar"], every=1, loss={"eps": 0.1}), "whatif loss settings ['eps'] unknown"),
        (dict(rules=["ar"], every=1, max_grad_norm=-1), "max_grad_norm must be a number > 0"),
    ],
)
def test_bad_options_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=None) as err:
        WhatIf(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_pass_without_old_logprobs_is_refused_and_earlier_steps_stay(tmp_path):
    model = _model(4)
    ids, mask, adv, _ = _batch(model)
    with pytest.raises(ValueError, match="WhatIf needs old_logprobs in st.track"):
        with Recorder(tmp_path / "r", model=model, whatif=WhatIf(rules=["ar"], every=2)) as rec:
            for step in range(3):
                with rec.step(step) as st:
                    _, lp, _, tgt = forward_logprobs(model, ids)
                    st.track(
                        lp,
                        token_ids=tgt,
                        mask=mask,
                        advantages=adv,
                        old_logprobs=None if step else lp.detach(),
                    )
                    st.backward(policy_loss(lp, lp.detach(), adv, mask).loss)
                    model.zero_grad()
    assert sorted(load_run(tmp_path / "r").steps.step) == [0, 1, 2]
    assert not math.isnan(0.0)
