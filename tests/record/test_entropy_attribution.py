"""Entropy attribution (Attribution(entropy=True)): a tabular softmax policy against the covariance law of
arXiv 2505.22617, and a brute-force per-token backward on tiny Llamas."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_V, forward_logprobs
from test_attribution import _model as _llama

from tokengrad import Recorder, load_run
from tokengrad.record import Attribution

# ---- the tabular softmax policy -------------------------------------------------------------------------
# Each state's probabilities are counts / 8 and each state's row holds its 8 actions in those counts, so a
# token mean over the batch is exactly the expectation under pi (means over a ~ pi are token means).
COUNTS = {1: [[4, 2, 1, 1]], 3: [[4, 2, 1, 1], [2, 2, 2, 2], [5, 1, 1, 1]]}


class Tabular(torch.nn.Module):
    """pi_s = softmax(z_s): the logits are the parameters ([S, K])."""

    def __init__(self, counts):
        super().__init__()
        self.z = torch.nn.Parameter(torch.tensor(counts, dtype=torch.float64).log())

    def scores(self, actions):  # actions [S, 8] -> (log pi [S, 8], H [S, 8])
        log_pi = torch.log_softmax(self.z, -1)  # [S, K]
        ent = -(log_pi.exp() * log_pi).sum(-1, keepdim=True)  # [S, 1]
        return log_pi.gather(1, actions), ent.expand_as(actions)


def _tabular_setup(n_states: int, seed: int = 0):
    counts = COUNTS[n_states]
    actions = torch.tensor([[a for a, c in enumerate(row) for _ in range(c)] for row in counts])  # [S, 8]
    pi = torch.tensor(counts, dtype=torch.float64) / 8  # [S, K]
    adv = torch.randn(pi.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    adv = adv - (pi * adv).sum(-1, keepdim=True)  # centred under each state's pi
    return Tabular(counts), actions, pi, adv


def _cov_pi(pi, x, y):
    """Cov_{a~pi}(x(a), y(a)) per state ([S])."""
    ex = (pi * x).sum(-1, keepdim=True)
    ey = (pi * y).sum(-1, keepdim=True)
    return (pi * (x - ex) * (y - ey)).sum(-1)


def _mean_entropy(z):
    log_pi = torch.log_softmax(z, -1)
    return float(-(log_pi.exp() * log_pi).sum(-1).mean())


def _logit_step(pi, adv, eta, natural):
    """delta z of one step on the token-mean loss -mean(A log pi): plain gradient descent gives
    (eta / S) pi A, natural policy gradient eta A (both with A centred under pi)."""
    return eta * adv if natural else eta * pi * adv / pi.shape[0]


def _record_tabular(tmp_path, n_states, eta, natural):
    model, actions, pi, adv = _tabular_setup(n_states)
    z0 = model.z.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=eta)
    with Recorder(tmp_path, model=model, attribution=Attribution(every=1, entropy=True)) as rec:
        with rec.step(0) as st:
            lp = model.scores(actions)[0]
            adv_tok = adv.gather(1, actions)  # [S, 8]
            st.track(lp, token_ids=actions, advantages=adv_tok, recompute=lambda: model.scores(actions))
            (-(adv_tok * lp).mean()).backward()
            st.record_grad_norms()
            assert torch.equal(model.z.detach(), z0), "attribution changed the parameters"
            if natural:  # the natural-gradient step on the logits, in place of the optimizer's
                with torch.no_grad():
                    model.z += _logit_step(pi, adv, eta, natural=True)
            else:
                opt.step()
            opt.zero_grad()
    z1 = model.z.detach()
    # arXiv 2505.22617: dH = -Cov_{a~pi}(log pi(a), delta z_a) to first order, per state
    formula = float(-_cov_pi(pi, pi.log(), z1 - z0).mean())
    # the recorder's directional pass runs at the updated parameters: the same law at pi after the update
    pi1 = torch.softmax(z1, -1)
    at_after = float(-_cov_pi(pi1, pi1.log(), z1 - z0).mean())
    measured = _mean_entropy(z1) - _mean_entropy(z0)
    return load_run(tmp_path), (formula, at_after), measured, pi, adv


@pytest.mark.parametrize("n_states", [1, 3])
@pytest.mark.parametrize("natural", [False, True])
def test_tabular_entropy_change_is_the_covariance_law(tmp_path, n_states, natural):
    eta = 0.02
    run, (formula, at_after), measured, pi, adv = _record_tabular(tmp_path, n_states, eta, natural)
    row = run.steps.iloc[0]
    # the recorded prediction along the applied update is the covariance law's first-order term, taken at
    # the parameters after the update (where the directional pass runs); both sides differ from the
    # measured change by a second-order term of opposite sign
    assert row["dentropy_mean_pred"] == pytest.approx(at_after, rel=1e-5)
    assert (at_after - measured) * (formula - measured) < 0
    assert row["dentropy_mean"] == pytest.approx(measured, rel=1e-4, abs=1e-7)
    # the measured change is the formula to O(eta^2): halving eta quarters the gap
    gaps = []
    for e in (eta, eta / 2):
        model, _, _, _ = _tabular_setup(n_states)
        z0 = model.z.detach().clone()
        dz = _logit_step(pi, adv, e, natural)
        exact = _mean_entropy(z0 + dz) - _mean_entropy(z0)
        gaps.append(abs(exact - float(-_cov_pi(pi, pi.log(), dz).mean())))
    assert abs(measured - formula) == pytest.approx(gaps[0], rel=1e-3, abs=1e-9)
    assert 0.2 < gaps[1] / gaps[0] < 0.3, gaps
    assert gaps[0] < 0.05 * abs(formula)
    # Cov(log pi, A) over the batch's tokens is the pi-weighted covariance averaged over states; natural
    # policy gradient moves the entropy by -eta times it (CW-GRPO's premise, arXiv 2605.11538)
    cov = float(_cov_pi(pi, pi.log(), adv).mean())
    assert row["cov_logprob_adv"] == pytest.approx(cov, rel=1e-5)
    if natural:
        assert formula == pytest.approx(-eta * cov, rel=1e-9)
    else:  # plain gradient: Cov(log pi, pi A) / S, and SGD's first-order change is -eta <grad H, g>
        assert formula == pytest.approx(-eta * float(_cov_pi(pi, pi.log(), pi * adv).mean()) / n_states)
        assert -eta * row["entropy_grad_dot"] == pytest.approx(formula, rel=1e-5)
    # per-token shares sum to 1 (no loss term outside log pi), so sum_t share_t * (-eta <grad H, g>) is
    # the SGD prediction; the tokens of one state share its change
    tok = run.tokens()
    assert tok["entropy_share"].sum() == pytest.approx(1.0, abs=1e-5)
    assert row["entropy_share_residual"] == pytest.approx(0.0, abs=1e-5)
    per_state = tok.groupby("sample_id")["dentropy_pred"].agg(["min", "max"])
    assert (per_state["max"] - per_state["min"]).abs().max() < 1e-7
    assert run.meta["attribute_entropy"] is True


def test_tabular_shares_follow_the_per_action_formula(tmp_path):
    # one state, plain gradient: coef_t = -A_t / n and <grad log pi_t, grad H> = -pi_a (log pi_a + H) for
    # the logit parameters, so entropy_share_t = -A_t pi_a (log pi_a + H) / (n <grad H, g>)
    run, _, _, pi, adv = _record_tabular(tmp_path, 1, 0.01, natural=False)
    tok = run.tokens().sort_values("position")
    log_pi, ent = pi[0].log(), float(-(pi[0] * pi[0].log()).sum())
    a = torch.tensor(tok["token_id"].to_numpy()).long()
    grad_h = -pi[0] * (log_pi + ent)  # dH/dz [K]
    dot_lp = grad_h[a] - (pi[0] * grad_h).sum()  # <e_a - pi, grad H> per token
    coef = -adv[0][a] / 8
    g = (coef[:, None] * (torch.nn.functional.one_hot(a, 4) - pi[0])).sum(0)  # [K]
    want = coef * dot_lp / float((grad_h * g).sum())
    got = torch.tensor(tok["entropy_share"].to_numpy(), dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)


# ---- brute force on tiny Llamas -------------------------------------------------------------------------
def _scores(model, ids):
    logits, lp, _, _ = forward_logprobs(model, ids)
    log_p = torch.log_softmax(logits.float(), -1)
    return lp, -(log_p.exp() * log_p).sum(-1)  # [N, T] each


def _loss(lp, old, adv, mask, total):
    ratio = (lp - old).exp()
    surr = torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    return -(surr * mask).sum() / total


def _brute_entropy_shares(model, ids, old, adv, mask, micro):
    """coef_t <grad log pi_t, grad H> / <grad H, g> by one backward per token ([N, T])."""
    params = [p for p in model.parameters()]
    lp, ent = _scores(model, ids)
    mean_h = (ent * mask).sum() / mask.sum()
    grad_h = torch.autograd.grad(mean_h, params, retain_graph=True)
    loss = sum(_loss(lp[r], old[r], adv[r], mask[r], mask.sum()) for r in micro)
    coef = torch.autograd.grad(loss, lp, retain_graph=True)[0]
    g = torch.autograd.grad(loss, params, retain_graph=True)
    h_dot_g = sum(float((a.double() * b.double()).sum()) for a, b in zip(grad_h, g))
    out = torch.zeros_like(lp, dtype=torch.float64)
    for i in range(lp.shape[0]):
        for j in range(lp.shape[1]):
            gr = torch.autograd.grad(lp[i, j], params, retain_graph=True, allow_unused=True)
            dot = sum(float((a.double() * b.double()).sum()) for a, b in zip(gr, grad_h) if a is not None)
            out[i, j] = float(coef[i, j]) * dot / h_dot_g
    return out, h_dot_g


@pytest.mark.parametrize("tied", [True, False])
def test_entropy_share_matches_per_token_backward(tmp_path, tied):
    model = _llama(tied)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, TINY_V, (4, 9), generator=gen)
    mask = torch.ones(4, 8)
    mask[1, 5:] = 0
    adv = torch.tensor([1.0, -0.5, 0.25, -1.5])
    with torch.no_grad():
        old = forward_logprobs(model, ids)[1] + 0.05 * torch.randn(4, 8, generator=gen)
    micro = list(torch.arange(4).chunk(2))  # gradient accumulation over two micro-batches
    with Recorder(tmp_path / "run", model=model, attribution=Attribution(every=1, entropy=True)) as rec:
        with rec.step(0) as st:
            before = []
            for rows in micro:
                x = ids[rows]
                lp = forward_logprobs(model, x)[1]
                st.track(
                    lp,
                    token_ids=x[:, 1:],
                    mask=mask[rows],
                    old_logprobs=old[rows],
                    advantages=adv[rows],
                    sample_ids=rows,
                    recompute=lambda x=x: _scores(model, x),
                )
                _loss(lp, old[rows], adv[rows], mask[rows], mask.sum()).backward()
                before.append(_scores(model, x)[1].detach())
            theta = [p.detach().clone() for p in model.parameters()]
            want, h_dot_g = _brute_entropy_shares(model, ids, old, adv, mask, micro)
            st.record_grad_norms()
            assert all(torch.equal(a, b) for a, b in zip(theta, model.parameters())), "theta changed"
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            after = [_scores(model, ids[rows])[1] for rows in micro]
    run = load_run(tmp_path / "run")
    tok = run.tokens()
    got = torch.full((4, 8), math.nan, dtype=torch.float64)
    meas = torch.full((4, 8), math.nan, dtype=torch.float64)
    for r in tok.itertuples():
        got[int(r.sample_id), int(r.position)] = float(r.entropy_share)
        meas[int(r.sample_id), int(r.position)] = float(r.dentropy)
    m = mask.bool()
    scale = float(want[m].abs().max())
    assert float((got[m] - want[m]).abs().max()) <= 1e-4 * scale, (got, want)
    assert float(got[m].sum()) == pytest.approx(1.0, abs=1e-4)
    row = run.steps.iloc[0]
    assert row["entropy_grad_dot"] == pytest.approx(h_dot_g, rel=1e-4)
    want_meas = torch.cat([a - b for a, b in zip(after, before)]).double()
    assert torch.allclose(meas[m], want_meas[m], atol=1e-5)
    assert row["dentropy_mean"] == pytest.approx(float(want_meas[m].mean()), rel=1e-3, abs=1e-7)
    # along AdamW's small step the first-order prediction carries the measured change
    pred = torch.tensor(tok.sort_values(["sample_id", "position"])["dentropy_pred"].to_numpy())
    assert torch.corrcoef(torch.stack([pred, want_meas[m].flatten()]))[0, 1] > 0.9


def test_entropy_attribution_needs_the_pair(tmp_path):
    model = _llama(True)
    ids = torch.randint(0, TINY_V, (2, 9), generator=torch.Generator().manual_seed(3))
    with Recorder(tmp_path / "run", model=model, attribution=Attribution(every=1, entropy=True)) as rec:
        with rec.step(0) as st:
            lp = forward_logprobs(model, ids)[1]
            only_lp = lambda: forward_logprobs(model, ids)[1]  # noqa: E731 - the plain contract
            st.track(lp, token_ids=ids[:, 1:], advantages=torch.tensor([1.0, -1.0]), recompute=only_lp)
            (-lp.sum()).backward()
            with pytest.raises(ValueError, match="must return the pair"):
                st.record_grad_norms()
    with pytest.raises(ValueError, match="entropy must be True or False"):
        Attribution(every=1, entropy="yes")


def test_trl_attach_refuses_entropy_attribution(tmp_path):
    pytest.importorskip("trl")
    from tokengrad.integrations import trl as tg_trl

    with pytest.raises(ValueError, match="log-probs only"):
        tg_trl.attach(object(), tmp_path / "run", attribution=Attribution(every=1, entropy=True))
