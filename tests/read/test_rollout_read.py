"""The rollout gap on the read side (tokengrad.read.rollout_queries) and its figures (figures.rollout):
hand-computed values on a run with chosen gaps, and pandas references on a tiny trainer run whose top-p
sampler differs from the trainer."""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
import pytest
from plotly.colors import sample_colorscale, unlabel_rgb
from rollout_runs import HAND, SAMPLES, train_gap_run, write_gap_run

from tokengrad import load_run
from tokengrad.figures.rollout import (
    NO_ROLLOUT,
    make_gap_by_position_figure,
    make_gap_by_prob_figure,
    make_gap_trajectory_figure,
    make_mismatch_share_figure,
    mismatch_summary,
)
from tokengrad.figures.style import captions
from tokengrad.figures.tokens import GAP, token_colors, with_gap
from tokengrad.read import rollout_queries as rq

close = partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-7)  # the token columns are float32
# d = log pi_old - log mu of the hand-made run's tokens, in HAND order (None: not scored)
D = [None if t[3] is None else t[2] - t[3] for t in HAND]  # [0.05, 0.5, 0.0, 0.2, None, -0.8]


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    return load_run(write_gap_run(tmp_path_factory.mktemp("gap") / "gap"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_run(train_gap_run(tmp_path_factory.mktemp("tiny") / "tiny"))


def test_gap_by_probability_and_position_hand_values(hand):
    prob = hand.sql("SELECT prob FROM tokens ORDER BY sample_id, position")["prob"].to_numpy()
    assert np.allclose(prob, np.exp([t[2] for t in HAND]))
    by_prob = rq.gap_by_prob(hand, bins=2)
    # p < 0.5: tokens 0 (0.37), 1 (0.14), 5 (0.37); token 4 (p = 0.05) has no engine log-prob
    assert by_prob["count"].tolist() == [3, 2]
    close(by_prob["gap_mean"], [(0.05 + 0.5 - 0.8) / 3, (0.0 + 0.2) / 2])
    close(by_prob["abs_gap_mean"], [(0.05 + 0.5 + 0.8) / 3, 0.1])
    close(by_prob["abs_gap_max"], [0.8, 0.2])
    by_pos = rq.gap_by_position(hand, bins=3)
    assert by_pos["count"].tolist() == [2, 1, 2] and by_pos["hi"].tolist() == [1.0, 2.0, 3.0]
    close(by_pos["gap_mean"], [0.125, 0.5, -0.4])
    assert rq.has_rollout(hand)


def test_mismatch_update_share_hand_values(hand):
    got = rq.mismatch_update_share(hand, tau=0.1).iloc[0]
    # |d| > 0.1: tokens 1 (0.5, share 0.5), 3 (0.2, masked: share 0) and 5 (0.8, masked)
    assert (got.n_tokens, got.n_scored, got.n_mismatched) == (6, 5, 3)
    assert got.token_share == pytest.approx(3 / 5) and got.update_share == pytest.approx(0.5)
    loose = rq.mismatch_update_share(hand, tau=0.0).iloc[0]  # every token with d != 0
    assert loose.n_mismatched == 4 and loose.update_share == pytest.approx(0.1 + 0.5)
    assert rq.mismatch_update_share(hand, tau=1.0).iloc[0].update_share == 0.0
    with pytest.raises(ValueError, match="tau must be a finite number >= 0"):
        rq.mismatch_update_share(hand, tau=-0.1)


def test_masked_sequences_hand_values(hand):
    got = rq.masked_sequences(hand)
    assert len(got) == 1
    row = got.iloc[0]
    assert (row.step, row.sample_id, row.masked_by, row.n_masked, row.n_tokens) == (
        0,
        1,
        "is_sequence_mask",
        3,
        3,
    )
    assert row.reward == SAMPLES[1]["reward"] and row.advantage == SAMPLES[1]["advantage"]
    assert row.rollout_seq_log_ratio == pytest.approx(0.2 + 0.0 - 0.8)  # the unscored token counts 0
    assert row.rollout_gap_mean == pytest.approx((0.2 - 0.8) / 2)


def test_queries_equal_pandas_on_a_trainer_run(tiny):
    tok = tiny.tokens(where="in_loss")
    d = tok.old_logprob.astype(float) - tok.rollout_logprob.astype(float)
    assert d.notna().all() and (d < 0).all()  # top-p: the engine gives every sampled token more mass
    by_prob = rq.gap_by_prob(tiny, bins=5)
    bins = np.minimum((tok.prob.astype(float) * 5).astype(int), 4)
    want = d.abs().groupby(bins).mean()
    np.testing.assert_allclose(by_prob.set_index(by_prob.index)["abs_gap_mean"].dropna(), want, rtol=1e-5)
    for tau in (0.1, 0.2):
        got = rq.mismatch_update_share(tiny, tau).set_index("step")
        live = tok[np.isfinite(tok.update_share)]  # updates without a gradient have NaN shares: left out
        assert sorted(got.index) == sorted(live.step.unique()) and len(got)
        for step, rows in live.groupby("step"):
            far = d[rows.index].abs() > tau
            assert got.loc[step, "n_mismatched"] == int(far.sum())
            assert got.loc[step, "update_share"] == pytest.approx(rows.update_share[far].sum(), abs=1e-6)
    # token_mask at C_min = exp(-0.2): the masked tokens are those with d < -0.2, their share of the update 0
    masked = tok[tok.masked]
    assert ((masked.old_logprob - masked.rollout_logprob) < -0.2 + 1e-6).all() and (masked.coef == 0).all()
    seqs = rq.masked_sequences(tiny)
    assert set(zip(seqs.step, seqs.sample_id)) == set(zip(masked.step, masked.sample_id))
    counts = masked.groupby(["step", "sample_id"]).position.nunique()
    assert seqs.set_index(["step", "sample_id"]).n_masked.to_dict() == counts.to_dict()


def test_figures_plot_the_query_values(hand):
    by_prob = rq.gap_by_prob(hand, bins=2)
    fig = make_gap_by_prob_figure(by_prob)
    bars, line = fig.data
    close(bars.y, by_prob["abs_gap_mean"])
    close(line.y, by_prob["gap_mean"])
    assert list(bars.x) == ["[0.00, 0.50)", "[0.50, 1.00)"] and captions(fig) == ["5 scored loss tokens"]
    pos = make_gap_by_position_figure(rq.gap_by_position(hand, bins=3))
    assert list(pos.data[0].x) == ["0", "1", "2"] and pos.layout.xaxis.type == "category"
    # 10 bins over positions 0..2: the 7 bins that hold no whole position are left out (they read "2-1",
    # which Plotly took for a date); 2 bins of positions 0..1 and 2 read with an en dash
    ten = make_gap_by_position_figure(rq.gap_by_position(hand, bins=10))
    assert list(ten.data[0].x) == ["0", "1", "2"]
    two = make_gap_by_position_figure(rq.gap_by_position(hand, bins=[0, 2, 3]))
    assert list(two.data[0].x) == ["0–1", "2"] and two.layout.xaxis.categoryarray == ("0–1", "2")
    close(pos.data[1].y, [0.125, 0.5, -0.4])
    steps = hand.steps
    traj = make_gap_trajectory_figure(steps)
    names = [t.name for t in traj.data]
    assert len(names) == 3 and traj.data[2].y[0] == 0.25  # mean |d|, max |d|, grad norm
    assert traj.data[0].y[0] == pytest.approx(np.mean([0.05, 0.5, 0.0, 0.2, 0.8]))
    assert traj.data[1].y[0] == pytest.approx(0.8)


def test_mismatch_share_figure_and_summary(hand, tiny):
    df = rq.mismatch_update_share(hand, tau=0.1)
    fig = make_mismatch_share_figure(df, tau=0.1)
    assert fig.data[0].y[0] == pytest.approx(0.5) and fig.data[1].y[0] == pytest.approx(0.6)
    assert captions(fig) == ["3 of 5 scored tokens made 50.0% of an update on average over 1 updates"]
    s = mismatch_summary(rq.mismatch_update_share(tiny, tau=0.2))
    tok = tiny.tokens(where="in_loss")
    far = (tok.old_logprob - tok.rollout_logprob).abs() > 0.2
    live = np.isfinite(tok.update_share)
    assert s["n_mismatched"] == int((far & live).sum()) and s["n_scored"] == int(live.sum())


def test_empty_states_say_what_is_missing():
    empty = pd.DataFrame({"lo": [0.0], "hi": [1.0], "count": [0], "gap_mean": [np.nan]})
    for fig in (make_gap_by_prob_figure(empty), make_gap_trajectory_figure(pd.DataFrame({"step": [0]}))):
        assert fig.layout.annotations[0].text == NO_ROLLOUT


def test_inspector_colours_a_completion_by_the_gap(hand):
    tokens = with_gap(hand.sql("SELECT * FROM tokens WHERE sample_id = 1 ORDER BY position"))
    close(tokens[GAP], [0.2, np.nan, -0.8])
    colors = token_colors(tokens[GAP], GAP)
    # diverging around 0 over [-0.8, 0.8]: -0.8 at RdBu's red end, 0.2 at (0.2 + 0.8) / 1.6 = 0.625
    want = sample_colorscale("RdBu", [0.625, 0.0])
    assert colors[1] is None and colors[2] == want[1] == "rgb(103, 0, 31)"
    close(unlabel_rgb(colors[0]), unlabel_rgb(want[0]), atol=1.0)  # float32 0.2: within one colour step
