"""A 1-step run, or a live step between two steps without a gradient: a line has no neighbour to join, so
the point gets a dot instead of drawing nothing (tokengrad.figures.curves.lone_points)."""

import numpy as np
import pandas as pd

from tokengrad.figures.curves import lone_points, make_metric_figure


def test_lone_points_by_hand():
    nan = np.nan
    assert lone_points([0.5]).tolist() == [True]
    assert lone_points([1.0, nan, 2.0, 3.0, nan]).tolist() == [True, False, False, False, False]
    assert lone_points([nan, 2.0, nan], connected=True).tolist() == [False, True, False]
    assert lone_points([1.0, nan, 2.0], connected=True).tolist() == [False, False, False]  # joined across


def _sizes(trace):
    return None if trace.marker.size is None else list(trace.marker.size)


def test_a_one_step_run_draws_its_point():
    steps = {"one": pd.DataFrame({"step": [0], "reward_mean": [0.25], "grad_norm": [0.92]})}
    for metric, smoothing in (("reward_mean", 0.6), ("grad_norm", 0.0)):
        fig = make_metric_figure(steps, metric, smoothing=smoothing)
        drawn = [t for t in fig.data if t.mode == "lines+markers"]
        assert drawn and all(_sizes(t) == [6] for t in drawn), metric
        assert [float(t.y[0]) for t in drawn][-1] == {"reward_mean": 0.25, "grad_norm": 0.92}[metric]


def test_longer_runs_keep_plain_lines_and_mark_only_isolated_steps():
    steps = {"r": pd.DataFrame({"step": [0, 1, 2, 3], "grad_norm": [1.0, 0.0, 2.0, 3.0]})}
    raw = make_metric_figure(steps, "grad_norm", smoothing=0.0).data[0]
    # step 1 had no gradient (a gap): step 0 stands alone and gets a dot, steps 2-3 are a line
    assert raw.mode == "lines+markers" and _sizes(raw) == [6, 0, 0, 0]
    plain = make_metric_figure({"r": pd.DataFrame({"step": [0, 1], "grad_norm": [1.0, 2.0]})}, "grad_norm")
    assert {t.mode for t in plain.data if t.type == "scatter"} == {"lines"}
