"""The headline quantities (tokengrad.read.headline): hand-computed pooling, the update norm recovered from
the bucket rows, and one number in README, docs/study.md, the dashboard and `tokengrad export` for every
shipped run, recomputed here from the raw tables."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tokengrad.figures.figureset import build_figure_set, headline_table
from tokengrad.read.headline import low_prob_shares, pooled_bucket_shares, pooled_step_shares, update_norms
from tokengrad.read.runs import list_runs, load_run

REPO = Path(__file__).resolve().parents[2]
SHIPPED = {Path(p).name: p for p in list_runs(REPO / "sample_runs")}


def _rows(step, update_id, g, shares, n):
    """Bucket rows of one update with |g| = g: cos_B = share_B |g| / |g_B| with |g_B| = 1."""
    labels = ["[0.00,0.50)", "[0.50,1.00)"]
    rows = [
        dict(
            step=step,
            rank=0,
            update_id=update_id,
            bucket=b,
            lo=lo,
            hi=lo + 0.5,
            n_tokens=k,
            grad_norm=1.0,
            update_share=s,
            cos_to_total=s * g,
        )  # fmt: skip
        for b, lo, s, k in zip(labels, (0.0, 0.5), shares, n)
    ]
    rows.append(dict(step=step, rank=0, update_id=update_id, bucket="residual", update_share=0.0))
    return rows


def test_lopti_phases_combine_into_the_steps_update():
    # step 0: phase 0 trains the low bucket only (|g| = 1), phase 1 the high bucket only (|g| = 0.5)
    b = pd.DataFrame(_rows(0, 0, 1.0, (1.0, 0.0), (2, 0)) + _rows(0, 1, 0.5, (0.0, 1.0), (0, 6)))
    np.testing.assert_allclose(update_norms(b).to_numpy(), [1.0, 0.5])
    per_step = pooled_step_shares(b)
    # combined: <g_low, g_0> / (1 + .25) = .8, high .25 / 1.25 = .2: sums to 1 (a plain mean gives .5 / .5)
    np.testing.assert_allclose(per_step.loc[0, ["[0.00,0.50)", "[0.50,1.00)"]], [0.8, 0.2])
    phase1 = pooled_bucket_shares(b, update_id=1).set_index("bucket")
    assert phase1.loc["[0.50,1.00)", "update_share"] == pytest.approx(1.0)
    pooled = pooled_bucket_shares(b).set_index("bucket")
    np.testing.assert_allclose(pooled.loc[["[0.00,0.50)", "[0.50,1.00)"], "token_share"], [0.25, 0.75])


def test_the_low_bucket_edge_follows_the_recorded_buckets():
    class R:
        buckets = pd.DataFrame(_rows(0, 0, 1.0, (0.7, 0.3), (1, 3)))
        layers = pd.DataFrame()

    h = low_prob_shares(R(), threshold=0.25)  # no edge at 0.25: the first bucket [0, 0.5) is used
    assert (h.below, h.token_share, h.update_share, h.n_updates) == (0.5, 0.25, pytest.approx(0.7), 1)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_update_norm_from_bucket_rows_equals_the_recorded_total(name):
    run = load_run(SHIPPED[name])
    g = update_norms(run.buckets)
    total = run.layers[run.layers["layer"] == "total"].groupby(["step", "update_id"])["grad_norm"].max()
    np.testing.assert_allclose(g.to_numpy(), total.reindex(g.index).to_numpy(), rtol=1e-4, atol=1e-7)


def _from_tables(run) -> tuple[float, float]:
    """The headline recomputed by hand from the raw buckets and layers tables (the module doc's formula)."""
    b = run.buckets[run.buckets["bucket"] != "residual"]
    total = run.layers[run.layers["layer"] == "total"].groupby(["step", "update_id"])["grad_norm"].max()
    g2 = total.reindex(pd.MultiIndex.from_frame(b[["step", "update_id"]])).to_numpy() ** 2
    live = g2 > 0
    low = (b["hi"] <= 0.25 + 1e-6).to_numpy() & live
    tokens = b["n_tokens"].to_numpy()[low].sum() / b["n_tokens"].to_numpy()[live].sum()
    analysed = total.reindex(pd.MultiIndex.from_frame(b[["step", "update_id"]].drop_duplicates()))
    weights = analysed[analysed > 0] ** 2  # sum over the analysed updates with a gradient of |g_u|^2
    return tokens, float((b["update_share"].to_numpy() * g2)[low].sum() / weights.sum())


def _sample_runs_lab_row() -> dict[str, tuple[float, float]]:
    text = (REPO / "docs" / "sample_runs.md").read_text()
    header = re.search(r"^\| \| (lab_\w+) \| (lab_\w+) \| (lab_\w+) \|$", text, re.M).groups()
    row = re.search(r"^\| p < 0\.25 tokens: share of loss tokens / share of the update.*\|$", text, re.M)
    cells = [c.strip() for c in row.group(0).strip("|").split("|")[1:]]
    return {n: tuple(float(x) for x in c.split(" / ")) for n, c in zip(header, cells)}


def test_readme_study_dashboard_and_export_give_the_same_headline():
    readme = _sample_runs_lab_row()
    front = (REPO / "README.md").read_text()
    study = (REPO / "docs" / "study.md").read_text()
    runs = {n: load_run(p) for n, p in SHIPPED.items()}
    exported = headline_table(runs).set_index("run")
    specs, _, failed = build_figure_set(runs)
    assert failed == []
    for name, run in runs.items():
        head = low_prob_shares(run)
        tokens, update = _from_tables(run)
        assert (head.token_share, head.update_share) == (
            pytest.approx(tokens),
            pytest.approx(update, abs=1e-5),
        )
        assert exported.loc[name, "update_share"] == pytest.approx(head.update_share)
        share = next(s.figure for s in specs if s.name == f"gradient_share_{name}")
        bar = next(t for t in share.data if t.name == "share of the update")
        assert bar.y[0] == pytest.approx(head.update_share)  # the p < 0.25 bar of the exported figure
        if name in readme:
            assert readme[name] == (round(head.token_share, 3), round(head.update_share, 3))
            pct = f"{head.token_share:.1%} / {head.update_share:.1%}".replace("%", " %")
            assert pct in study, f"docs/study.md does not give {name}'s {pct}"
            assert f"{head.update_share:.1%}".replace("%", " %") in front, f"README lacks {name}'s share"
    # docs/sample_runs.md's SmolLM2 sentence: at step 4 of smollm_grpo, p < 0.25 tokens are 11 % and make 74 %
    s4 = low_prob_shares(runs["smollm_grpo"], (4, 4))
    assert (round(100 * s4.token_share), round(100 * s4.update_share)) == (11, 74)
    sample_runs_doc = (REPO / "docs" / "sample_runs.md").read_text()
    assert "are 11 % of the loss tokens and make 74 % of the update" in sample_runs_doc


def test_the_landing_page_shows_the_headline_of_every_picked_shipped_run(monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tokengrad.read import served_root

    monkeypatch.setenv(served_root.ENV_ROOT, str(REPO / "sample_runs"))
    at = AppTest.from_file(str(REPO / "tokengrad" / "app" / "streamlit_app.py"), default_timeout=120).run()
    at.multiselect(key="tg_pick").set_value(sorted(SHIPPED)).run()
    assert not at.exception
    summary = at.dataframe[0].value.set_index("run")
    for name, path in SHIPPED.items():
        head = low_prob_shares(load_run(path))
        assert summary.loc[name, "low_update"] == pytest.approx(head.update_share)
        assert summary.loc[name, "low_tokens"] == pytest.approx(head.token_share)
        assert summary.loc[name, "status"] == "finished"
    said = " ".join(m.value for m in at.markdown)
    assert "lab_grpo: 66% of the update from 6% of the loss tokens" in said
