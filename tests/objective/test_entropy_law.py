"""The entropy law of arXiv 2602.03392 (Thm. 3.2), dH = -eps p_k (H + log p_k), checked per token: on a
softmax step worked by hand, and as the read-side query on a small recorded run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch

from tokengrad import Recorder, load_run
from tokengrad.figures.entropy import make_entropy_law_figure
from tokengrad.read.entropy_law import (
    LAW_MIN_ONE_MINUS_P,
    LAW_PRED,
    entropy_law,
    entropy_law_fit,
    entropy_law_pred,
    entropy_law_s_star,
    law_fit,
)
from tokengrad.record import Attribution

LN2 = math.log(2)


class OneLogit(torch.nn.Module):
    """S positions with fixed logits z0 [S, K] and one parameter each, added to the logit of the position's
    sampled token k_s: a gradient step is exactly the law's logit step eps = -lr dL/dtheta_s on token k."""

    def __init__(self, z0: torch.Tensor, k: torch.Tensor):
        super().__init__()
        self.register_buffer("z0", z0)
        self.register_buffer("onehot", torch.nn.functional.one_hot(k, z0.shape[1]).double())  # [S, K]
        self.k = k  # [S]
        self.theta = torch.nn.Parameter(torch.zeros(len(k), dtype=torch.float64))  # [S]

    def logits(self) -> torch.Tensor:
        return self.z0 + self.theta[:, None] * self.onehot  # [S, K]

    def scores(self):  # -> (log pi [S, 1], H [S, 1])
        lp = torch.log_softmax(self.logits(), -1)  # [S, K]
        return lp.gather(1, self.k[:, None]), -(lp.exp() * lp).sum(-1, keepdim=True)


def record_one_logit(path, lr: float, steps: int = 2, n: int = 40):
    """`steps` plain-gradient steps of -mean(A log pi) on the OneLogit policy, entropy attribution each."""
    g = torch.Generator().manual_seed(0)
    z0 = torch.randn(n, 5, generator=g, dtype=torch.float64) * 1.5  # [S, K]
    k = torch.multinomial(torch.softmax(z0, -1), 1, generator=g)[:, 0]  # [S] sampled tokens
    adv = torch.randn(n, 1, generator=g, dtype=torch.float64)  # [S, 1]
    model = OneLogit(z0, k)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with Recorder(path, model=model, attribution=Attribution(every=1, entropy=True)) as rec:
        for step in range(steps):
            with rec.step(step) as st:
                lp = model.scores()[0]
                st.track(
                    lp,
                    token_ids=k[:, None],
                    advantages=adv,
                    logits=model.logits()[:, None, :],
                    recompute=model.scores,
                )
                (-(adv * lp).mean()).backward()
                st.record_grad_norms()
                opt.step()
                opt.zero_grad()
    return load_run(path)


@pytest.fixture(scope="module")
def small_step_run(tmp_path_factory):
    return record_one_logit(tmp_path_factory.mktemp("law") / "small", lr=0.5)


def _entropy(z: torch.Tensor) -> float:
    lp = torch.log_softmax(z.double(), -1)
    return float(-(lp.exp() * lp).sum())


def test_s_star_by_hand():
    # z = (log 2, 0, 0): p = (1/2, 1/4, 1/4), H = 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2
    p = np.array([0.5, 0.25, 0.25])
    h = 1.5 * LN2
    # S*_0 = 1/2 (1.5 ln 2 - ln 2) = ln 2 / 4; S*_1 = 1/4 (1.5 ln 2 - 2 ln 2) = -ln 2 / 8
    assert entropy_law_s_star(p, [h] * 3) == pytest.approx([LN2 / 4, -LN2 / 8, -LN2 / 8])
    assert entropy_law_pred([0.5], [h], [0.01]) == pytest.approx([-0.01 * LN2 / 4])


@pytest.mark.parametrize("k, s_star", [(0, LN2 / 4), (1, -LN2 / 8)])
def test_the_law_is_the_exact_entropy_change_to_first_order(k, s_star):
    z = torch.tensor([LN2, 0.0, 0.0], dtype=torch.float64)
    h0 = _entropy(z)
    assert h0 == pytest.approx(1.5 * LN2)
    errors = []
    for eps in (1e-2, 5e-3, 2.5e-3):
        exact = _entropy(z + eps * torch.eye(3, dtype=torch.float64)[k]) - h0
        law = float(entropy_law_pred([[0.5, 0.25][k]], [h0], [eps])[0])
        assert law == pytest.approx(-eps * s_star)
        assert exact == pytest.approx(
            law, rel=0.05
        )  # the likely token's rise lowers H, the other's raises it
        errors.append(abs(exact - law))
    # the remainder is O(eps^2): halving eps quarters it
    assert errors[0] / errors[1] == pytest.approx(4, rel=0.05)
    assert errors[1] / errors[2] == pytest.approx(4, rel=0.05)


def test_a_uniform_pair_has_no_first_order_change():
    # p = (1/2, 1/2): S* = 1/2 (ln 2 + ln 1/2) = 0, and the exact change is the second-order -eps^2 / 8
    eps = 1e-2
    assert entropy_law_pred([0.5], [LN2], [eps]) == pytest.approx([0.0], abs=1e-15)
    exact = _entropy(torch.tensor([eps, 0.0])) - LN2
    assert exact == pytest.approx(-(eps**2) / 8, rel=1e-3)


def test_law_fit_matches_scipy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    y = 0.7 * x + rng.normal(scale=0.5, size=200)
    y[:5] = 0.0  # zeros leave the sign count
    fit = law_fit(x, y)
    assert fit["pearson"] == pytest.approx(scipy.stats.pearsonr(x, y)[0])
    assert fit["spearman"] == pytest.approx(scipy.stats.spearmanr(x, y)[0])
    assert fit["slope"] == pytest.approx(scipy.stats.linregress(x, y).slope)
    assert fit["sign_agree"] == pytest.approx((np.sign(x[5:]) == np.sign(y[5:])).mean())
    assert math.isnan(law_fit([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])["pearson"])  # a constant side


def test_the_query_on_a_recorded_run(small_step_run):
    got = entropy_law(small_step_run)
    tok = small_step_run.tokens()
    tok = tok[tok["in_loss"] & np.isfinite(tok["entropy_share"]) & (1 - tok["prob"] >= LAW_MIN_ONE_MINUS_P)]
    assert len(got) == len(tok) == 80  # 40 positions x 2 steps, every one with a gradient
    want = tok.sort_values(["step", "sample_id", "position"])
    got = got.sort_values(["step", "sample_id", "position"])
    p, h = want["prob"].to_numpy(float), want["entropy"].to_numpy(float)
    eps = want["dlogprob"].to_numpy(float) / (1 - p)
    assert got["eps"].to_numpy() == pytest.approx(eps, rel=1e-6)
    assert got[LAW_PRED].to_numpy() == pytest.approx(-eps * p * (h + np.log(p)), rel=1e-6, abs=1e-12)
    fit = entropy_law_fit(got)
    assert fit["step"].tolist() == [0, 1, -1]  # per step, then pooled
    pooled = fit.iloc[-1]
    assert pooled["n"] == 80
    assert pooled["pearson"] == pytest.approx(np.corrcoef(got[LAW_PRED], got["dentropy"])[0, 1])
    one = entropy_law(small_step_run, steps=(1, 1))
    assert set(one["step"]) == {1} and len(one) == 40


def test_the_law_holds_on_one_logit_steps_and_breaks_on_large_ones(small_step_run, tmp_path):
    # each position's only moving logit is its sampled token's: the law is the exact first order there,
    # so at a small step the measured changes lie on y = x; a step 40x larger bends them (second order)
    small = law_fit(*entropy_law(small_step_run)[[LAW_PRED, "dentropy"]].to_numpy().T)
    assert small["pearson"] > 0.999 and small["slope"] == pytest.approx(1.0, abs=0.02)
    assert small["sign_agree"] == 1.0
    big = law_fit(
        *entropy_law(record_one_logit(tmp_path / "big", lr=20.0))[[LAW_PRED, "dentropy"]].to_numpy().T
    )
    assert big["pearson"] < small["pearson"] and abs(big["slope"] - 1) > 0.05


def test_the_figure_and_an_empty_run(small_step_run):
    df = entropy_law(small_step_run)
    fig = make_entropy_law_figure(df)
    assert list(fig.data[0].y) == pytest.approx(df["dentropy"].tolist())
    fit = law_fit(df[LAW_PRED], df["dentropy"])
    assert f"Pearson {fit['pearson']:.3f}" in fig.layout.title.text
    empty = make_entropy_law_figure(pd.DataFrame())
    assert "no entropy attribution" in empty.layout.annotations[0].text
