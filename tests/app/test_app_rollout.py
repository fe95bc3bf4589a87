"""The "Rollout vs trainer" page and the inspector's gap colouring, through Streamlit's AppTest, on a tiny
trainer run with a real sampler gap (top-p at T = 0.1, token_mask), the hand-made gap run and a synthetic
run without rollout log-probs."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest
from rollout_runs import train_gap_run, write_gap_run
from streamlit.testing.v1 import AppTest
from synthetic_runs import write_synthetic_run
from test_app import APP, _charts

from tokengrad.figures.tokens import GAP, token_colors
from tokengrad.read import rollout_queries as rq
from tokengrad.read import served_root
from tokengrad.read.runs import load_run

PAGE = "views/rollout.py"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout_root")
    train_gap_run(root / "tiny")
    write_gap_run(root / "hand")
    write_synthetic_run(root / "plain", n_steps=3, n_samples=2, n_tok=4)
    return root


def _page(root, monkeypatch, run: str) -> AppTest:
    monkeypatch.setenv(served_root.ENV_ROOT, str(root))
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.multiselect(key="tg_pick").set_value([run]).run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_page_charts_and_masked_table_on_a_trainer_run(root, monkeypatch):
    at = _page(root, monkeypatch, "tiny")
    assert not at.warning, [w.value for w in at.warning]
    run = load_run(root / "tiny")
    figs = _charts(at)
    assert len(figs) == 4  # trajectory, by probability, by position, update share
    steps = figs[0]["data"]
    np.testing.assert_allclose(steps[0]["y"], run.steps.sort_values("step").rollout_mismatch, rtol=1e-9)
    np.testing.assert_allclose(steps[2]["y"], run.steps.sort_values("step").grad_norm, rtol=1e-9)
    by_prob = rq.gap_by_prob(run, bins=10)
    bars = np.asarray(figs[1]["data"][0]["y"], dtype=float)
    np.testing.assert_allclose(bars[by_prob["count"] > 0], by_prob["abs_gap_mean"].dropna(), rtol=1e-9)
    # the share chart at the default tau = 0.1: the step with a gradient, its mismatched tokens' share
    share = rq.mismatch_update_share(run, 0.1)
    np.testing.assert_allclose(figs[3]["data"][0]["y"], share.update_share, rtol=1e-9)
    masked = at.dataframe[-1].value
    want = rq.masked_sequences(run)
    assert (
        masked[["step", "sample_id", "n_masked"]].values.tolist()
        == want[["step", "sample_id", "n_masked"]].values.tolist()
    )
    assert (masked.masked_by == "is_token_mask").all()
    link = urlparse(masked.inspector.iloc[0])
    assert link.path == "inspector" and parse_qs(link.query) == {
        "runs": ["tiny"],
        "step": [str(want.step.iloc[0])],
        "sample": [str(want.sample_id.iloc[0])],
    }


def test_tau_widget_recomputes_the_update_share(root, monkeypatch):
    at = _page(root, monkeypatch, "hand")
    fig = _charts(at)[3]
    assert fig["data"][0]["y"][0] == pytest.approx(0.5)  # tau = 0.1: tokens 1, 3, 5 (hand values)
    at.select_slider(key="ro_tau").set_value(0.5).run()
    assert not at.exception
    # |d| > 0.5: token 5 only (d = 0.8, masked: share 0); token 1 (d = 0.5 exactly in float32) no longer
    fig = _charts(at)[3]
    assert fig["data"][0]["y"][0] == 0.0 and fig["data"][1]["y"][0] == pytest.approx(1 / 5)
    caption = " ".join(c.value for c in at.caption)
    assert "Tokens with |d| > 0.5: 20.0% of the scored tokens, 0.0% of an update" in caption


def test_a_run_without_rollout_logprob_says_what_produces_it(root, monkeypatch):
    at = _page(root, monkeypatch, "plain")
    assert not _charts(at)
    text = at.info[0].value
    assert text.startswith("No rollout_logprob in plain")
    for what in ("built-in trainer", "use_vllm=True", "rollout_func", "rollout_logprobs=", "docs/rollout.md"):
        assert what in text, what


def test_inspector_colours_the_completion_by_the_gap(root, monkeypatch):
    monkeypatch.setenv(served_root.ENV_ROOT, str(root))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update({"runs": "hand", "step": "0", "sample": "1"})  # the masked table's link
    at.run()
    at.switch_page("views/inspector.py").run()
    at.selectbox(key="in_color").set_value(GAP).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="in_sample_0").value == 1  # the linked completion opens
    html = at.get("html")[0].proto.body
    assert html.count('class="tg-tok"') == 3
    # sample 1's gaps are 0.2, none (not scored) and -0.8: the boxes carry exactly those colours
    tok = load_run(root / "hand").sql("SELECT * FROM tokens WHERE sample_id = 1 ORDER BY position")
    gap = (tok.old_logprob - tok.rollout_logprob).to_numpy()
    np.testing.assert_allclose(gap, [0.2, np.nan, -0.8], rtol=1e-6)
    colors = token_colors(gap, GAP)
    assert colors[1] is None and colors[2] == "rgb(103, 0, 31)"  # -0.8: the red end of RdBu
    for color in colors:
        assert f"background:{color or 'transparent'}" in html
    assert "rollout gap: log π_old − log μ" in at.selectbox(key="in_color").options
