"""The read side of entropy attribution (tokengrad.read.entropy_queries), its figures and the dashboard
page, on a recorded run of the tabular softmax policy (two steps, three states)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from synthetic_runs import write_synthetic_run
from test_entropy_attribution import _tabular_setup

from tokengrad import Recorder, load_run
from tokengrad.figures.entropy import (
    make_entropy_position_figure,
    make_entropy_quadrant_figure,
    make_entropy_steps_figure,
    prediction_fit,
)
from tokengrad.read.entropy_queries import (
    DRAIN,
    entropy_by_position,
    entropy_drainers,
    entropy_quadrants,
    entropy_steps,
)
from tokengrad.record import Attribution


@pytest.fixture(scope="module")
def tabular_run(tmp_path_factory):
    """Two plain-gradient steps of the three-state tabular policy with entropy attribution every step."""
    path = tmp_path_factory.mktemp("entropy") / "tabular"
    model, actions, _, adv = _tabular_setup(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    adv_tok = adv.gather(1, actions)  # [S, 8]
    with Recorder(path, model=model, attribution=Attribution(every=1, entropy=True)) as rec:
        for step in range(2):
            with rec.step(step) as st:
                lp = model.scores(actions)[0]
                st.track(lp, token_ids=actions, advantages=adv_tok, recompute=lambda: model.scores(actions))
                (-(adv_tok * lp).mean()).backward()
                st.record_grad_norms()
                opt.step()
                opt.zero_grad()
    return load_run(path)


def _drains(run) -> pd.DataFrame:
    tok, steps = run.tokens(), run.steps[["step", "entropy_grad_dot"]]
    tok = tok.merge(steps, on="step")
    return tok.assign(**{DRAIN: tok["entropy_share"] * tok["entropy_grad_dot"]})


def test_drainers_rank_tokens_by_their_part_of_the_entropy_change(tabular_run):
    want = _drains(tabular_run)
    got = entropy_drainers(tabular_run, k=5)
    order = ["step", "sample_id", "position"]  # the query's tie-break (equal actions drain equally)
    top = want.sort_values([DRAIN, *order], ascending=[False, True, True, True]).head(5)
    assert got[DRAIN].to_numpy() == pytest.approx(top[DRAIN].to_numpy(), rel=1e-6)
    assert list(got["step"]) == list(top["step"]) and list(got["position"]) == list(top["position"])
    # the drains of one update sum to <grad H, g> (no residual): the step's first-order entropy change
    per_step = want.groupby("step")[DRAIN].sum()
    assert per_step.to_numpy() == pytest.approx(tabular_run.steps["entropy_grad_dot"].to_numpy(), rel=1e-5)
    one = entropy_drainers(tabular_run, steps=(1, 1), k=100)
    assert set(one["step"]) == {1} and len(one) == 24
    assert one["drain_share"].sum() == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="lo <= hi"):
        entropy_drainers(tabular_run, steps=(2, 1))


def test_quadrants_and_positions_are_sums_of_token_rows(tabular_run):
    tok = _drains(tabular_run)
    q = entropy_quadrants(tabular_run, edges=(0.0, 0.3, 1.0))
    tok["lo"] = np.where(tok["prob"] >= 0.3, 0.3, 0.0)
    tok["adv_sign"] = np.sign(tok["advantage"]).astype(int)
    want = tok.groupby(["lo", "adv_sign"]).agg(
        n=("prob", "size"), share=("entropy_share", "sum"), meas=("dentropy", "mean")
    )
    got = q.set_index(["lo", "adv_sign"])
    assert got["n_tokens"].to_dict() == want["n"].to_dict()
    # two updates: each cell's shares are per update, so over all cells they sum to 1 (no residual)
    assert got["entropy_share"].to_numpy() == pytest.approx(want["share"].to_numpy() / 2, abs=1e-7)
    assert got["dentropy"].to_numpy() == pytest.approx(want["meas"].to_numpy(), rel=1e-5)
    assert q["entropy_share"].sum() == pytest.approx(1.0, abs=1e-5)
    assert set(q["hi"]) <= {0.3, 1.0}
    pos = entropy_by_position(tabular_run, bins=4)
    assert pos["n_tokens"].tolist() == [12, 12, 12, 12]  # positions 0-7 of 3 rows x 2 steps, 2 per bin
    assert pos["entropy_share"].sum() == pytest.approx(1.0, abs=1e-5)
    by_pos = tok.assign(b=tok["position"] // 2).groupby("b")["dentropy_pred"].mean()
    assert pos["dentropy_pred"].to_numpy() == pytest.approx(by_pos.to_numpy(), rel=1e-5)


def test_steps_and_figures(tabular_run):
    steps = entropy_steps(tabular_run)
    assert steps["step"].tolist() == [0, 1]
    fit = prediction_fit(steps)
    assert fit["n"] == 2 and fit["r"] == pytest.approx(1.0)  # two points lie on a line
    fig = make_entropy_steps_figure(steps)
    assert list(fig.data[0].x) == pytest.approx(steps["dentropy_mean_pred"].tolist())
    q = entropy_quadrants(tabular_run)
    fig = make_entropy_quadrant_figure(q)
    shares = sum(sum(t.y) for t in fig.data if t.xaxis == "x")
    assert shares == pytest.approx(q["entropy_share"].sum())
    fig = make_entropy_position_figure(entropy_by_position(tabular_run))
    assert len(fig.data) == 3


def test_runs_without_entropy_attribution_give_empty_answers(tmp_path):
    run = load_run(write_synthetic_run(tmp_path / "old", n_steps=3))
    assert entropy_drainers(run).empty and entropy_quadrants(run).empty
    assert entropy_by_position(run).empty and entropy_steps(run).empty
    for fig in (
        make_entropy_quadrant_figure(entropy_quadrants(run)),
        make_entropy_position_figure(entropy_by_position(run)),
        make_entropy_steps_figure(entropy_steps(run)),
    ):
        assert "no entropy attribution" in fig.layout.annotations[0].text


def test_dashboard_page(tabular_run, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tokengrad.read import served_root
    from tokengrad.schema import TOK

    root = tmp_path / "root"
    shutil.copytree(tabular_run.path, root / "tabular")
    monkeypatch.setenv(served_root.ENV_ROOT, str(root))
    entry = Path(__file__).resolve().parents[2] / "tokengrad" / "app" / "streamlit_app.py"
    app = AppTest.from_file(str(entry), default_timeout=60).run()
    app.switch_page("views/entropy.py").run()
    assert not app.exception, [e.value for e in app.exception]
    assert not app.warning, [w.value for w in app.warning]
    assert len(app.get("plotly_chart")) == 4  # with the entropy law's, empty here (no entropy column)
    top = app.dataframe[0].value
    assert len(top) == 25 and top[TOK.entropy_share].notna().all()
