"""Runs recorded with the built-in trainer: every figure draws on a 1-step run, and the bucket figures'
caption counts the updates a bucket pass analysed ('k of k analysed updates had a gradient'), not the
attribution steps' share-only bucket rows nor a Lopti phase that no token reached."""

import numpy as np
import pandas as pd
import pytest
from test_training_math import tiny

from tokengrad import load_run
from tokengrad.schema import BIN, BUCKET, STEP


def _train(tmp_path_factory, name, **overrides):
    from tokengrad.train.trainer import train

    root = tmp_path_factory.mktemp(name)
    train(**tiny(root, name, **overrides))
    return load_run(root / name)


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    """One step with every optional table: bucket analysis, attribution with entropy, an evaluation."""
    return _train(
        tmp_path_factory,
        "one",
        steps=1,
        bucket_every=1,
        attribute_every=1,
        attribute_entropy=True,
        eval_every=1,
        eval_per_difficulty=2,
    )


def _numbers(values) -> np.ndarray:
    if values is None:
        return np.array([])
    flat = pd.Series(np.asarray(values, dtype=object).ravel())
    return pd.to_numeric(flat, errors="coerce").to_numpy(float)


def _draws(t) -> bool:
    """Whether the trace puts ink on the page: a marker or text on a finite point, a line between two
    finite neighbours, a finite bar or cell, an image."""
    if t.type in ("scatter", "scattergl"):
        mode, y = t.mode or "lines+markers", np.isfinite(_numbers(t.y))
        size = t.marker.size
        marked = y & (np.asarray(size, float) > 0) if size is not None and not np.isscalar(size) else y
        if ("markers" in mode or "text" in mode) and marked.any() and (size is None or np.any(size)):
            return True
        return "lines" in mode and bool((y[1:] & y[:-1]).any())
    if t.type == "bar":
        return bool(np.isfinite(_numbers(t.x if t.orientation == "h" else t.y)).any())
    if t.type == "heatmap":
        return bool(np.isfinite(_numbers(t.z)).any())
    if t.type == "image":
        return t.source is not None or t.z is not None
    raise AssertionError(f"no rule for a {t.type} trace")


def _drawn(fig) -> list[str]:
    return [t.name or t.type for t in fig.data if t.visible is not False and _draws(t)]


def test_export_figures_draw_on_a_one_step_run(one_step):
    from tokengrad.figures.figureset import build_figure_set

    fs = build_figure_set({"one": one_step})
    assert not fs.notes and not fs.failed
    assert len(fs.specs) == 12
    for spec in fs.specs:
        assert _drawn(spec.figure), f"{spec.name} draws nothing on a 1-step run"


def _dashboard_figures(run) -> dict:
    """The dashboard's figures of the run (tokengrad/app/views), from the read functions the pages call."""
    from tokengrad import figures as F
    from tokengrad.figures import entropy as E
    from tokengrad.figures import rollout as R
    from tokengrad.figures.probability import make_partition_share_figure
    from tokengrad.read import entropy_law, entropy_queries, queries, rollout_queries, share_queries

    st, b = run.steps, run.buckets
    binned = queries.grad_norm_by_prob(run)
    return {
        "overview": lambda: F.make_overview_figure({"one": st}),
        "layer_heatmap": lambda: F.make_layer_heatmap_figure(run.layers),
        "bucket_dprob": lambda: F.make_bucket_dprob_figure(b),
        "bucket_grad_norm": lambda: F.make_bucket_grad_norm_figure(b),
        "bucket_steps_cos": lambda: F.make_bucket_steps_figure(b, BUCKET.cos_to_total),
        "bucket_steps_dprob": lambda: F.make_bucket_steps_figure(b, BUCKET.dprob_mean),
        "accuracy_over_steps": lambda: F.make_accuracy_over_steps_figure({"one": run.evals}),
        "prob_histogram": lambda: F.make_prob_histogram_figure(binned[[BIN.lo, BIN.hi, BIN.count]]),
        "partition": lambda: make_partition_share_figure(share_queries.share_by_partition(run), "prob"),
        "entropy_steps": lambda: E.make_entropy_steps_figure(st.dropna(subset=[STEP.dentropy_mean_pred])),
        "entropy_law": lambda: E.make_entropy_law_figure(entropy_law.entropy_law(run)),
        "entropy_quadrants": lambda: E.make_entropy_quadrant_figure(entropy_queries.entropy_quadrants(run)),
        "entropy_position": lambda: E.make_entropy_position_figure(
            entropy_queries.entropy_by_position(run, bins=10)
        ),
        "gap_steps": lambda: R.make_gap_trajectory_figure(st),
        "gap_prob": lambda: R.make_gap_by_prob_figure(rollout_queries.gap_by_prob(run, bins=10)),
        "gap_position": lambda: R.make_gap_by_position_figure(rollout_queries.gap_by_position(run, bins=10)),
        "mismatch": lambda: R.make_mismatch_share_figure(
            rollout_queries.mismatch_update_share(run, tau=0.1), 0.1
        ),
        "tokens": lambda: F.make_token_figure(queries.sample_tokens(run, step=0, sample_id=0), "prob"),
    }  # fmt: skip


def test_dashboard_figures_draw_on_a_one_step_run(one_step):
    for name, make in _dashboard_figures(one_step).items():
        assert _drawn(make()), f"{name} draws nothing on a 1-step run"


def test_caption_counts_only_updates_a_bucket_pass_analysed(tmp_path_factory):
    from tokengrad.figures import bucket_shares, make_bucket_share_figure

    # attribution every 3 steps, bucket analysis every 2: step 3 is attributed but not analysed
    run = _train(tmp_path_factory, "b2a3", steps=5, bucket_every=2, attribute_every=3)
    b = run.buckets
    share_only = b[b[BUCKET.step] == 3]
    assert len(share_only) and share_only[BUCKET.grad_norm].isna().all()  # the rows that were miscounted
    assert (run.steps[STEP.grad_norm] > 0).all()  # every step had a gradient
    note = "3 of 3 analysed updates had a gradient (steps 0, 2, 4; update 0)"
    assert bucket_shares(b).attrs["note"] == note
    assert make_bucket_share_figure(b, title="t").layout.title.text == f"t<br><sup>{note}</sup>"


def test_lopti_phase_without_tokens_is_not_counted_and_keeps_the_probability_change(tmp_path_factory):
    from tokengrad.figures import bucket_shares, make_bucket_dprob_figure

    # the tiny model gives every token p < 0.5: Lopti's second phase (updates 2, 3 with mu = 2) is empty,
    # and the step's probability change sits on its last update's rows
    run = _train(tmp_path_factory, "lopti", steps=1, bucket_every=1, weighting="lopti", num_iterations=2)
    b = run.buckets
    per_update = b.groupby(BUCKET.update_id)[BUCKET.n_tokens].sum()
    assert per_update.to_dict() == {0: 64, 1: 64, 2: 0, 3: 0}
    s = bucket_shares(b)
    assert s.attrs["note"] == (
        "2 of 2 analysed updates had a gradient (step 0; updates 0, 1); "
        "2 updates without loss tokens not counted"
    )
    recorded = b[(b[BUCKET.update_id] == 3) & b[BUCKET.dprob_mean].notna()]
    got = s.set_index(BUCKET.bucket)[BUCKET.dprob_mean].dropna()
    assert got.to_dict() == pytest.approx(dict(zip(recorded[BUCKET.bucket], recorded[BUCKET.dprob_mean])))
    assert _drawn(make_bucket_dprob_figure(b))
