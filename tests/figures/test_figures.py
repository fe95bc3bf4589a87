"""Pure figure builders: figure contents against hand-computed inputs (no streamlit, no browser)."""

import base64
import io
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from plotly.colors import sample_colorscale

from tokengrad.figures import (
    bucket_shares,
    debiased_ema,
    figure_table,
    find_spikes,
    make_accuracy_by_difficulty_figure,
    make_accuracy_over_steps_figure,
    make_bucket_dprob_figure,
    make_bucket_grad_norm_figure,
    make_bucket_share_figure,
    make_bucket_steps_figure,
    make_grad_norm_figure,
    make_grad_vs_prob_figure,
    make_gradient_share_figure,
    make_layer_grad_norm_figure,
    make_layer_heatmap_figure,
    make_metric_figure,
    make_overview_figure,
    make_prob_histogram_figure,
    make_summary_table,
    make_token_figure,
    make_weight_curve_figure,
    paper_style,
    plottable_metrics,
    reference_curves,
    run_color,
    summarize_run,
    token_html,
    top_layers,
    with_update_shares,
)
from tokengrad.figures.evals import wilson_interval
from tokengrad.figures.style import (
    RUN_PALETTE,
    bucket_color,
    bucket_colors,
    captions,
    integer_step_axis,
    legend_height,
    log_ticks,
)
from tokengrad.figures.tokens import color_range
from tokengrad.figures.wordclouds import (
    clean_token,
    find_font,
    make_high_low_wordcloud_figure,
    prepare_frequencies,
    wordcloud_png,
)


def _steps(values, ranks=1, column="reward_mean"):
    """A steps table: `values` per step; rank r holds value + r - (ranks-1)/2 so the rank mean is `values`."""
    return pd.DataFrame(
        [
            {"step": s, "rank": r, column: v + r - (ranks - 1) / 2}
            for s, v in enumerate(values)
            for r in range(ranks)
        ]
    )


# ---- smoothing and spikes ------------------------------------------------------------------------------


def test_debiased_ema_matches_tensorboard_by_hand():
    # w = 0.5: last = .5*0 + .5*1 = .5 -> .5/(1-.5) = 1;  last = .25 + 1 = 1.25 -> 1.25/.75 = 5/3;
    # last = .625 + 2 = 2.625 -> 2.625/.875 = 3
    np.testing.assert_allclose(debiased_ema([1.0, 2.0, 4.0], 0.5), [1.0, 5 / 3, 3.0])
    # NaN/inf are skipped (TensorBoard): the third point averages 1 and 4 with weights .5, 1 -> 4.5/1.5 = 3
    out = debiased_ema([1.0, np.nan, 4.0], 0.5)
    assert np.isnan(out[1]) and out[2] == pytest.approx(3.0)
    assert np.isnan(debiased_ema([1.0, np.inf, 4.0], 0.5)[1])
    np.testing.assert_array_equal(debiased_ema([3.0, 1.0], 0.0), [3.0, 1.0])
    with pytest.raises(ValueError, match="smoothing"):
        debiased_ema([1.0], 1.0)


def test_debiased_ema_equals_tensorboard_loop_on_random_series():
    x = np.random.default_rng(0).lognormal(size=50)
    w, last, ref = 0.8, 0.0, []
    for n, v in enumerate(x, start=1):
        last = last * w + (1 - w) * v
        ref.append(last / (1 - w**n))
    np.testing.assert_allclose(debiased_ema(x, w), ref, rtol=1e-12)


def test_find_spikes_modified_z_score():
    # median 1.0; |x - median| = 0 .1 .1 0 9 .05 .05 -> MAD .05; sigma = 1.4826*.05 = .07413;
    # threshold 1 + 3.5*.07413 = 1.2595 -> only the 10
    assert find_spikes([1, 1.1, 0.9, 1.0, 10, 1.05, 0.95]).tolist() == [4]
    # MAD = 0 (more than half the values equal): no robust scale, so the largest steps are not spikes
    assert find_spikes([1, 1, 1, 1, 3]).tolist() == []
    assert find_spikes([0.0] * 30 + [4.0, 5.0, 6.0]).tolist() == []  # dead zeros must not make 4-6 spikes
    assert find_spikes([2.0, 2.0, 2.0]).tolist() == []
    assert find_spikes([1.0, np.inf, 1.0, np.nan]).tolist() == [1]  # inf is a spike, NaN is missing
    assert find_spikes([1, 1.1, 0.9, 1.0, 10, 1.05, 0.95], k=200).tolist() == []  # (10-1)/.07413 = 121 < 200


# ---- colours, style ------------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_run_color_is_stable_across_calls_and_processes():
    names = ["grpo", "tr_grpo", "ar_lopti", "run 4"]
    here = [run_color(n) for n in names]
    assert here == [run_color(n) for n in names] and set(here) <= set(RUN_PALETTE)
    code = f"from tokengrad.figures.style import run_color; print(','.join(run_color(n) for n in {names!r}))"
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip().split(",") == here


def test_paper_style_sizes_and_strips_title():
    fig = make_metric_figure({"a": _steps([1.0, 2.0])}, "reward_mean", title="dashboard title")
    col = paper_style(fig)
    assert (col.layout.width, col.layout.height) == (336, round(3.5 * 0.68 * 96))  # 3.5 in at 96 px/in
    # 11 px = 8.25 pt text, 10 px ticks, at most 6 ticks: readable in a 3.5 in column
    assert col.layout.title.text is None and col.layout.template.layout.font.size == 11
    assert col.layout.xaxis.tickfont.size == 10 and col.layout.xaxis.nticks == 6
    assert paper_style(fig, keep_title=True).layout.title.text == "dashboard title"
    assert paper_style(fig, "page").layout.width == 672
    assert fig.layout.title.text == "dashboard title"  # the input is not modified
    with pytest.raises(ValueError, match="column"):
        paper_style(fig, "poster")


# ---- overview ------------------------------------------------------------------------------------------


def test_metric_figure_overlays_runs_with_raw_and_smoothed_traces():
    fig = make_metric_figure(
        {"a": _steps([1.0, 2.0, 4.0], ranks=2), "b": _steps([0.0, 1.0])}, "reward_mean", smoothing=0.5
    )
    assert [t.name for t in fig.data] == ["a raw", "a", "b raw", "b"]
    a_raw, a_smooth = fig.data[0], fig.data[1]
    np.testing.assert_allclose(a_raw.y, [1.0, 2.0, 4.0])  # mean over the two ranks (v - .5, v + .5)
    np.testing.assert_allclose(a_smooth.y, [1.0, 5 / 3, 3.0])  # debiased EMA by hand, see above
    assert list(a_raw.x) == [0, 1, 2]
    assert a_smooth.line.color == a_raw.line.color == run_color("a") and fig.data[3].line.color == run_color(
        "b"
    )
    assert not a_raw.showlegend and a_smooth.showlegend and a_raw.legendgroup == "a"
    assert make_metric_figure({"a": _steps([1.0])}, "reward_mean", log_y=True).layout.yaxis.type == "log"
    assert len(make_metric_figure({"a": _steps([1.0])}, "kl").data) == 0  # no such values: empty figure


def test_grad_norm_figure_takes_max_over_updates_and_marks_spikes():
    rows = [
        {"step": s, "rank": 0, "update_id": u, "layer": layer, "grad_norm": v * (u + 1) * m}
        for s, v in enumerate([1, 1.1, 0.9, 1.0, 10, 1.05, 0.95])
        for u in (0, 1)
        for layer, m in (("total", 1.0), ("model.layers.0", 0.1))
    ]
    fig = make_grad_norm_figure({"r": pd.DataFrame(rows)}, smoothing=0.0)
    assert [t.name for t in fig.data] == ["r", "r spikes"]
    np.testing.assert_allclose(
        fig.data[0].y, 2 * np.array([1, 1.1, 0.9, 1.0, 10, 1.05, 0.95])
    )  # update 1 = 2x
    assert list(fig.data[1].x) == [4] and list(fig.data[1].y) == [20.0]
    assert fig.layout.yaxis.type == "log"
    heat = make_layer_heatmap_figure(pd.DataFrame(rows))
    assert list(heat.data[0].y) == ["model.layers.0"]
    np.testing.assert_allclose(heat.data[0].customdata[0], 0.2 * np.array([1, 1.1, 0.9, 1.0, 10, 1.05, 0.95]))


def test_overview_figure_skips_unrecorded_metrics():
    df = _steps([1.0, 2.0]).assign(loss=[0.5, 0.25])
    fig = make_overview_figure({"a": df}, metrics=("reward_mean", "loss", "kl"), smoothing=0.0)
    assert [a.text for a in fig.layout.annotations] == ["reward", "loss"]
    assert [t.name for t in fig.data] == ["a", "a"] and [t.showlegend for t in fig.data] == [True, False]
    np.testing.assert_allclose(fig.data[1].y, [0.5, 0.25])


def test_summary_table_by_hand():
    class R:
        name = "r"
        meta = {"weighting": {"name": "tr_grpo", "params": {"alpha": 0.5, "tau": 1}}}
        steps = pd.DataFrame(
            {
                "step": range(20),
                "rank": 0,
                "reward_mean": np.arange(20) / 10.0,
                "grad_norm": [1.0, 2.0, 3.0] * 6 + [1.0, 50.0],
            }
        )
        layers = pd.DataFrame()
        evals = pd.DataFrame(
            {
                "step": [5, 19, 19],
                "rank": 0,
                "task": "kk",
                "difficulty": ["3", "3", "5"],
                "accuracy": [0.1, 0.5, 0.2],
                "n": [10, 30, 10],
            }
        )

    row = make_summary_table([R()]).iloc[0]
    assert (row["run"], row["rule"], row["params"], row["steps"]) == ("r", "tr_grpo", "alpha=0.5, tau=1", 20)
    assert row["final_reward"] == pytest.approx((1.8 + 1.9) / 2)  # last 10% of 20 steps = 2 steps
    assert row["eval_accuracy"] == pytest.approx((0.5 * 30 + 0.2 * 10) / 40)  # last eval step, n-weighted
    g = np.array([1.0, 2.0, 3.0] * 6 + [1.0, 50.0])
    assert row["grad_norm_cv"] == pytest.approx(g.std() / g.mean())
    assert (row["spikes"], row["spike_steps"]) == (1, "19")


# ---- buckets -------------------------------------------------------------------------------------------


def _buckets():
    # |g| = 1 at step 0 and 2 at step 1; cos(g_B, g) = share * |g| / |g_B|, so that the buckets' norms and
    # cosines give back |g| (tokengrad.read.headline.update_norms)
    rows = []
    for step, (n_lo, n_hi, u_lo, u_hi) in enumerate([(1, 3, 0.6, 0.5), (3, 3, 0.8, 0.3)]):
        g = 1.0 + step
        rows += [
            {
                "step": step,
                "rank": 0,
                "update_id": 0,
                "bucket": "[0.50,1.00)",
                "lo": 0.5,
                "hi": 1.0,
                "n_tokens": n_hi,
                "grad_norm": 1.0,
                "update_share": u_hi,
                "cos_to_total": u_hi * g / 1.0,
                "dprob_mean": 0.02,
                "correct_ratio": 0.4,
            },
            {
                "step": step,
                "rank": 0,
                "update_id": 0,
                "bucket": "[0.00,0.50)",
                "lo": 0.0,
                "hi": 0.5,
                "n_tokens": n_lo,
                "grad_norm": 3.0,
                "update_share": u_lo,
                "cos_to_total": u_lo * g / 3.0,
                "dprob_mean": 0.1,
                "correct_ratio": 0.6,
            },
            {
                "step": step,
                "rank": 0,
                "update_id": 0,
                "bucket": "residual",
                "n_tokens": 0,
                "update_share": 1 - u_lo - u_hi,
            },
        ]
    return pd.DataFrame(rows)


def test_bucket_shares_by_hand():
    s = bucket_shares(_buckets())
    assert list(s["bucket"]) == ["[0.00,0.50)", "[0.50,1.00)", "residual"]  # by lower edge, residual last
    # tokens: low 1 + 3 = 4, high 3 + 3 = 6 -> shares .4, .6;
    # update shares pooled by |g|^2 = 1, 4: (.6 * 1 + .8 * 4) / 5 = .76, (.5 + .3 * 4) / 5 = .34, residual -.1
    np.testing.assert_allclose(s["token_share"], [0.4, 0.6, 0.0])
    np.testing.assert_allclose(s["update_share"], [0.76, 0.34, -0.1])
    # without the norms (no cosines, no layers total) the updates count equally: the plain means
    plain = bucket_shares(_buckets().drop(columns="cos_to_total"))
    np.testing.assert_allclose(plain["update_share"], [0.7, 0.4, -0.1])
    np.testing.assert_allclose(bucket_shares(_buckets(), step_range=(1, 1))["token_share"], [0.5, 0.5, 0.0])
    fig = make_bucket_share_figure(_buckets())
    assert [t.name for t in fig.data] == ["share of loss tokens", "share of the update"]
    np.testing.assert_allclose(fig.data[1].y, [0.76, 0.34, -0.1])


def test_bucket_steps_figure_stacks_shares_per_step():
    fig = make_bucket_steps_figure(_buckets())
    assert [t.name for t in fig.data] == ["[0.00,0.50)", "[0.50,1.00)", "residual"]
    np.testing.assert_allclose(fig.data[0].y, [0.6, 0.8])
    np.testing.assert_allclose(fig.data[2].y, [-0.1, -0.1])
    assert fig.layout.barmode == "relative" and fig.data[2].marker.color == "#9E9E9E"
    lines = make_bucket_steps_figure(_buckets(), "grad_norm")
    assert lines.data[0].type == "scatter" and list(lines.data[0].y) == [3.0, 3.0]
    with pytest.raises(ValueError, match="known"):
        make_bucket_steps_figure(_buckets(), "nope")


def test_bucket_dprob_and_correct_ratio():
    fig = make_bucket_dprob_figure(_buckets())
    assert list(fig.data[0].x) == ["[0.00,0.50)", "[0.50,1.00)"]
    np.testing.assert_allclose(fig.data[0].y, [0.1, 0.02])
    np.testing.assert_allclose(fig.data[1].y, [0.6, 0.4])


def test_reference_curves_and_grad_vs_prob_figure():
    ref = reference_curves([0.0, 0.5, 1.0])
    np.testing.assert_allclose(ref["(1 − p)"], [1.0, 0.5, 0.0])
    np.testing.assert_allclose(ref["√2 (1 − p)"], [1.41421356, 0.70710678, 0.0])
    binned = pd.DataFrame(
        {
            "lo": [0.0, 0.5],
            "hi": [0.5, 1.0],
            "count": [3, 0],
            "prob": [0.2, np.nan],
            "logit_grad_unit": [0.9, np.nan],
        }
    )
    fig = make_grad_vs_prob_figure(binned, ref_scale=2.0)
    assert [t.name for t in fig.data] == ["(1 − p)", "√2 (1 − p)", "mean per probability bin"]
    assert fig.data[0].y[50] == pytest.approx(2 * 0.5) and fig.data[1].y[0] == pytest.approx(2 * np.sqrt(2))
    assert list(fig.data[2].x) == [0.2] and list(fig.data[2].y) == [0.9]  # the empty bin is dropped
    with pytest.raises(ValueError, match="no column"):
        make_grad_vs_prob_figure(binned, "head_grad_norm")


def test_prob_histogram_figure_normalises():
    hist = pd.DataFrame({"lo": [0.0, 0.5], "hi": [0.5, 1.0], "count": [1, 3]})
    fig = make_prob_histogram_figure(hist)
    np.testing.assert_allclose(fig.data[0].y, [0.25, 0.75])
    np.testing.assert_allclose(fig.data[0].x, [0.25, 0.75])


def test_weight_curve_from_meta():
    metas = {
        "tr": {"weighting": {"name": "tr_grpo", "curve": {"p": [0, 0.5, 1], "w": [0.5, 1.0, 1.5]}}},
        "grpo": {"weighting": {"name": "grpo"}},
    }
    fig = make_weight_curve_figure(metas)
    assert [t.name for t in fig.data] == ["tr"] and list(fig.data[0].y) == [0.5, 1.0, 1.5]
    assert fig.data[0].line.color == run_color("tr")
    with pytest.raises(ValueError, match="equal-length"):
        make_weight_curve_figure({"x": {"weighting": {"curve": {"p": [0, 1], "w": [1]}}}})


# ---- evals ---------------------------------------------------------------------------------------------


def _evals():
    return pd.DataFrame(
        {
            "step": [0, 0, 10, 10, 10, 10],
            "rank": [0, 0, 0, 1, 0, 0],
            "task": "kk",
            "difficulty": ["3", "10", "3", "3", "10", "2"],
            "accuracy": [0.1, 0.0, 0.5, 1.0, 0.2, 0.9],
            "n": [10, 10, 10, 30, 10, 10],
        }
    )


def test_accuracy_by_difficulty_uses_last_step_weighted_by_n():
    fig = make_accuracy_by_difficulty_figure({"a": _evals()})
    assert list(fig.data[0].x) == ["2", "3", "10"]  # numeric order
    assert list(fig.layout.xaxis.ticktext) == ["2<br>n=10", "3<br>n=40", "10<br>n=10"]  # n once per tick
    assert list(fig.data[0].text) == ["90%", "88%", "20%"]
    other = _evals().assign(n=lambda d: d["n"] * 2)
    two = make_accuracy_by_difficulty_figure({"a": _evals(), "b": other})  # n differs: on each bar instead
    assert list(two.layout.xaxis.ticktext) == ["2", "3", "10"] and two.data[1].text[1] == "88%<br>n=80"
    # difficulty 3 at step 10: ranks 0 and 1 -> (0.5*10 + 1.0*30) / 40 = 0.875
    np.testing.assert_allclose(fig.data[0].y, [0.9, 0.875, 0.2])
    assert [int(c[0]) for c in fig.data[0].customdata] == [10, 40, 10]
    over = make_accuracy_over_steps_figure({"a": _evals()})
    # step 0: (0.1*10 + 0*10)/20 = .05; step 10: (5 + 30 + 2 + 9)/60 = 46/60
    np.testing.assert_allclose(over.data[0].y, [0.05, 46 / 60])
    facets = make_accuracy_over_steps_figure({"a": _evals()}, by_difficulty=True)
    assert [a.text for a in facets.layout.annotations] == ["difficulty 2", "difficulty 3", "difficulty 10"]


# ---- token inspector -----------------------------------------------------------------------------------


def _completion():
    return pd.DataFrame(
        {
            "position": [1, 0, 2],
            "token": ["<b>", "Hi", "\n"],
            "prob": [0.25, 1.0, 0.5],
            "coef": [-2.0, 0.0, 1.0],
            "in_loss": [True, True, False],
        }
    )


def test_token_html_colours_escapes_and_hovers():
    html = token_html(_completion(), "prob")
    spans = html.split('<span class="tg-tok"')[1:]
    assert len(spans) == 3
    assert f"background:{sample_colorscale('RdYlBu', [1.0])[0]}" in spans[0] and ">Hi</span>" in spans[0]
    assert f"background:{sample_colorscale('RdYlBu', [0.25])[0]}" in spans[1]
    assert "&lt;b&gt;" in spans[1] and "<b>" not in spans[1]
    assert "prob 0.25" in spans[1] and "coef -2" in spans[1]  # hover lists every recorded value
    assert "↵<br>" in spans[2] and "opacity:0.45" in spans[2]  # newline shown, not-in-loss faded
    # signed values: symmetric scale [-2, 2], so coef 0 sits at the middle of RdBu
    signed = token_html(_completion(), "coef")
    assert f"background:{sample_colorscale('RdBu', [0.5])[0]}" in signed.split('<span class="tg-tok"')[1]
    with pytest.raises(ValueError, match="cannot colour"):
        token_html(_completion(), "weight")
    # the PPO ratio diverges around 1: ratios 0.9, 1.0, 1.2 -> scale [0.8, 1.2], ratio 1 in the middle
    ratio = token_html(_completion().assign(ratio=[0.9, 1.0, 1.2]), "ratio")
    assert f"background:{sample_colorscale('RdBu', [0.5])[0]}" in ratio.split('<span class="tg-tok"')[1]
    assert color_range([0.9, 1.0, 1.2], "ratio") == pytest.approx((0.8, 1.2))


def test_token_figure_grid():
    fig = make_token_figure(_completion(), "prob", per_row=2)
    z = np.array(fig.data[0].z, dtype=object)
    assert z.shape == (2, 2) and list(z[0]) == [1.0, 0.25] and z[1][0] == 0.5 and z[1][1] is None
    assert fig.data[0].text[0][1] == "<b>" and fig.data[0].text[1][0] == "↵"
    assert (fig.data[0].zmin, fig.data[0].zmax) == (0.0, 1.0)


# ---- word clouds ---------------------------------------------------------------------------------------


def test_clean_token_and_frequencies():
    assert clean_token("Ġthe") == "the" and clean_token("▁cat") == "cat" and clean_token(" dog ") == "dog"
    assert clean_token("Ċ") == "↵" and clean_token("  ") == "␣␣" and clean_token("\t") == "⇥"
    assert clean_token("Ġ", show_whitespace=False) is None and clean_token("") is None
    freqs = pd.DataFrame(
        {"token": ["Ġthe", "the", "<|im_end|>", "Ċ", "∇", "and"], "count": [3, 2, 9, 1, 4, 5]}
    )
    assert prepare_frequencies(freqs) == {"the": 5.0, "and": 5.0, "∇": 4.0, "↵": 1.0}
    assert prepare_frequencies(freqs, show_whitespace=False, stop_tokens={"and"}, max_words=2) == {
        "the": 5.0,
        "∇": 4.0,
    }
    with pytest.raises(ValueError, match="missing"):
        prepare_frequencies(pd.DataFrame({"word": ["a"]}))
    # byte pieces stay (special-token look-alikes), sizes can be the summed gradient
    assert prepare_frequencies({"<0xE2>": 3, "<|im_end|>": 2}) == {"<0xE2>": 3.0}
    grads = pd.DataFrame({"token": ["a", "b"], "count": [1, 5], "grad_sum": [2.0, 0.5]})
    assert prepare_frequencies(grads, size_by="grad_sum") == {"a": 2.0, "b": 0.5}


def test_wordcloud_figure_two_png_panels():
    from PIL import Image

    assert find_font().endswith(".ttf") and os.path.exists(find_font())
    high = pd.DataFrame({"token": ["Ġthe", "∇", "π"], "count": [10, 5, 3]})
    fig = make_high_low_wordcloud_figure(high, high.iloc[:0], width=200, height=100)
    assert [t.type for t in fig.data] == ["image", "image"]
    assert [a.text for a in fig.layout.annotations][:2] == [
        "high-probability tokens",
        "low-probability tokens",
    ]
    assert "no tokens" in [a.text for a in fig.layout.annotations]
    png = base64.b64decode(fig.data[0].source.split(",", 1)[1])
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert img.shape == (100, 200, 3) and (img < 200).any()  # words were drawn
    blank = np.asarray(Image.open(io.BytesIO(base64.b64decode(fig.data[1].source.split(",", 1)[1]))))
    assert (blank == 255).all()
    assert wordcloud_png({"a": 1.0}, width=50, height=40)[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_shown_together_get_distinct_colours():
    from tokengrad.figures.style import RUN_PALETTE, run_colors

    names = [f"run{i}" for i in range(8)]
    cmap = run_colors(names)
    assert len(set(cmap.values())) == 8 and set(cmap.values()) <= set(RUN_PALETTE)
    assert run_colors(list(reversed(names))) == cmap  # order of selection does not matter
    assert run_colors(names, {"run3": "#000000"})["run3"] == "#000000"


# ---- steps without a gradient ----------------------------------------------------------------------


def _layers(values, layers=(("total", 1.0),)):
    return pd.DataFrame(
        [
            {"step": s, "rank": 0, "update_id": 0, "layer": name, "grad_norm": v * k}
            for s, v in enumerate(values)
            for name, k in layers
        ]
    )


def test_grad_norm_figure_marks_dead_steps_and_smooths_over_live_ones():
    fig = make_grad_norm_figure({"r": _layers([2.0, 0.0, 4.0, 0.0, 0.0, 8.0])}, smoothing=0.5, spike_k=None)
    raw, smooth, key, dead = fig.data
    np.testing.assert_array_equal(raw.y, [2.0, np.nan, 4.0, np.nan, np.nan, 8.0])  # gaps, not the log floor
    # debiased EMA (w = .5) over the live values 2, 4, 8 only: 2; (.5*2 + 4)/1.5; (.25*2 + .5*4 + 8)/1.75
    np.testing.assert_allclose(smooth.y[[0, 2, 5]], [2.0, 10 / 3, 6.0])
    assert np.isnan(smooth.y[[1, 3, 4]]).all() and smooth.connectgaps  # bridged, never decayed
    np.testing.assert_array_equal(smooth.customdata, raw.y)  # hover shows the recorded value
    assert list(dead.x) == [1, 3, 4] and dead.name == "r: no gradient" and not dead.showlegend
    assert key.name == "step without gradient" and len(key.x) == 0  # one legend entry for every run
    assert captions(fig) == ["r: 3 of 6 steps had no gradient"]  # the count: a caption, not the legend
    assert dead.yaxis == "y2" and fig.layout.yaxis2.range == (0, 1) and not fig.layout.yaxis2.visible
    assert fig.layout.hovermode == "x unified"
    all_dead = make_grad_norm_figure({"r": _layers([0.0, 0.0])})
    assert "no step had a gradient" in [a.text for a in all_dead.layout.annotations]
    assert captions(all_dead) == ["r: 2 of 2 steps had no gradient"]


def test_spikes_and_cv_are_computed_over_live_steps():
    g = [0.0] * 10 + [1, 1.1, 0.9, 1.0, 10, 1.05, 0.95]
    fig = make_grad_norm_figure({"r": _layers(g)}, smoothing=0.0)
    spikes = next(t for t in fig.data if t.name == "r spikes")
    assert list(spikes.x) == [14]  # the MAD of the live steps, not of a series that is mostly 0
    row = summarize_run("r", {}, _steps([0.0] * len(g)), layers=_layers(g))
    live = np.array(g[10:])
    assert row["no_gradient"] == "10 of 17 steps had no gradient"
    assert row["grad_norm_cv"] == pytest.approx(live.std() / live.mean())
    assert (row["spikes"], row["spike_steps"]) == (1, "14")
    dead = summarize_run("d", {}, _steps([0.0, 0.0]), layers=_layers([0.0, 0.0]))
    assert dead["no_gradient"] == "2 of 2 steps had no gradient" and np.isnan(dead["grad_norm_cv"])


def test_curves_against_wall_time_and_tokens_seen():
    steps = _steps([1.0, 2.0, 3.0]).assign(time_step=[3600.0, 1800.0, 1800.0], n_tokens=[10, 20, 5])
    by_tokens = make_metric_figure({"a": steps}, "reward_mean", smoothing=0.0, x_axis="tokens seen")
    np.testing.assert_allclose(by_tokens.data[0].x, [10, 30, 35])
    by_time = make_metric_figure({"a": steps}, "reward_mean", smoothing=0.0, x_axis="wall time (h)")
    np.testing.assert_allclose(by_time.data[0].x, [1.0, 1.5, 2.0])
    assert by_time.layout.xaxis.title.text == "wall time (h)"
    with pytest.raises(ValueError, match="known"):
        make_metric_figure({"a": steps}, "reward_mean", x_axis="epoch")
    assert plottable_metrics({"a": steps}) == ["reward_mean", "n_tokens", "time_step"]


def test_overview_panels_share_zoom_and_have_axis_titles():
    df = _steps([1.0, 2.0]).assign(loss=[0.5, 0.25], kl=[0.1, 0.2])
    fig = make_overview_figure({"a": df}, metrics=("reward_mean", "loss", "kl"), smoothing=0.0)
    assert fig.layout.xaxis3.matches == "x" and fig.layout.xaxis.matches is None
    assert fig.layout.yaxis.title.text == "reward" and fig.layout.yaxis3.title.text == "loss"
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1  # beside, not over the titles


def test_per_layer_chart_highlights_the_top_k_blocks():
    blocks = [("total", 1.0)] + [(f"model.layers.{i}", 1.0 + i) for i in range(30)]
    fig = make_layer_grad_norm_figure(_layers([1.0, 2.0, 0.0], blocks), top_k=3, smoothing=0.0)
    assert top_layers(_layers([1.0, 2.0], blocks), 3) == [
        "model.layers.29",
        "model.layers.28",
        "model.layers.27",
    ]
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert "other blocks" in legend and "model.layers.29" in legend and len(legend) == 5  # + dead-step key
    grey = [t for t in fig.data if t.name == "other blocks"]
    assert len(grey) == 27 and {t.line.color for t in grey} == {"#BDBDBD"}
    assert all(np.isnan(t.y[2]) for t in fig.data if t.yaxis == "y")  # step 2 is dead: a gap in every block
    ticks = [t for t in fig.data if t.yaxis == "y2" and len(t.x)]
    assert len(ticks) == 1 and ticks[0].name == "all blocks: no gradient"
    assert captions(fig) == ["all blocks: 1 of 3 steps had no gradient"]


# ---- the gradient by probability, and the bucket analysis -------------------------------------------


def test_gradient_share_figure_labels_and_empty_states():
    shares = pd.DataFrame(
        {
            "lo": [0.0, 0.5],
            "hi": [0.5, 1.0],
            "count": [1, 3],
            "grad_sum": [3.0, 1.0],
            "token_share": [0.25, 0.75],
            "grad_share": [0.75, 0.25],
        }
    )
    fig = make_gradient_share_figure(shares)
    assert [t.name for t in fig.data] == ["share of loss tokens", "share of summed per-token gradient norm"]
    assert list(fig.data[0].x) == ["[0.00,0.50)", "[0.50,1.00)"]
    np.testing.assert_allclose(fig.data[1].y, [0.75, 0.25])
    with_update = make_gradient_share_figure(shares.assign(update_share=[0.9, 0.1]))
    assert with_update.data[2].name == "share of the update (per-token attribution)"
    # the bucket analysis' pooled share replaces the attribution bar when it has the same buckets
    pooled = pd.DataFrame(
        {"bucket": ["[0.00,0.50)", "[0.50,1.00)", "residual"], "update_share": [0.7, 0.3, 0.0]}
    )
    both = with_update_shares(shares.assign(update_share=[0.9, 0.1]), pooled)
    assert both.attrs["update_from"] == "bucket analysis" and "update_share" not in both
    headline = make_gradient_share_figure(both)
    assert headline.data[2].name == "share of the update"
    np.testing.assert_allclose(headline.data[2].y, [0.7, 0.3])
    other = with_update_shares(shares, pooled.assign(bucket=["[0.00,0.25)", "[0.25,1.00)", "residual"]))
    assert other.attrs["update_from"] == "none" and "bucket_update_share" not in other  # buckets differ
    dead = make_gradient_share_figure(shares.assign(grad_sum=0.0, grad_share=np.nan))
    assert not dead.data and "every token's gradient is 0" in dead.layout.annotations[0].text


def _dead_update(step):
    return [
        {
            "step": step,
            "rank": 0,
            "update_id": 0,
            "bucket": b,
            "lo": lo,
            "hi": hi,
            "n_tokens": n,
            "grad_norm": 0.0,
            "update_share": np.nan,
        }
        for b, lo, hi, n in (
            ("[0.00,0.50)", 0.0, 0.5, 5),
            ("[0.50,1.00)", 0.5, 1.0, 5),
            ("residual", np.nan, np.nan, np.nan),
        )
    ]


def test_bucket_analysis_uses_only_updates_with_a_gradient():
    df = pd.concat([_buckets(), pd.DataFrame(_dead_update(2))], ignore_index=True)
    s = bucket_shares(df)
    np.testing.assert_allclose(s["token_share"], [0.4, 0.6, 0.0])  # the dead step's 5 + 5 tokens left out
    assert s.attrs["note"] == "2 of 3 analysed updates had a gradient (steps 0, 1; update 0)"
    fig = make_bucket_share_figure(df, title="t")
    assert "2 of 3 analysed updates" in fig.layout.title.text
    dead = make_bucket_share_figure(pd.DataFrame(_dead_update(0) + _dead_update(10)))
    assert not dead.data
    assert dead.layout.annotations[0].text == "all 2 analysed steps had no gradient (every advantage was 0)"
    assert not make_bucket_grad_norm_figure(pd.DataFrame(_dead_update(0))).data


def test_bucket_norms_skip_empty_buckets_and_zero_residual_is_hidden():
    df = _buckets()
    df.loc[(df["step"] == 1) & (df["bucket"] == "[0.00,0.50)"), ["n_tokens", "grad_norm"]] = [0, 0.0]
    s = bucket_shares(df)
    assert s.set_index("bucket").loc["[0.00,0.50)", "grad_norm"] == 3.0  # not (3 + 0) / 2
    zero_res = df.assign(update_share=np.where(df["bucket"] == "residual", 0.0, df["update_share"]))
    assert [t for t in make_bucket_share_figure(zero_res).data[0].x] == ["[0.00,0.50)", "[0.50,1.00)"]
    assert "residual" in list(make_bucket_share_figure(df).data[0].x)  # -10 %: shown


def test_figure_table_long_form():
    fig = make_grad_norm_figure({"r": _layers([2.0, 0.0])}, smoothing=0.0, spike_k=None)
    t = figure_table(fig)
    assert list(t.columns) == ["trace", "panel", "x", "y"]
    assert t[t["trace"] == "r"]["y"].tolist()[0] == 2.0
    assert t[t["trace"] == "r: no gradient"]["x"].tolist() == [1]
    blocks = (("total", 1), ("model.layers.0", 0.5))
    heat = figure_table(make_layer_heatmap_figure(_layers([1.0, 2.0], blocks)))
    assert heat["z"].tolist() == [0.5, 1.0]


def test_accuracy_carries_n_wilson_interval_and_zero_is_not_missing():
    # 0 of 4: centre = (z²/8) / (1 + z²/4) and half-width z/(1 + z²/4) sqrt(z²/64): equal, so [0, 2 centre]
    z2 = 1.959964**2
    lo, hi = wilson_interval([0.0, 0.5], [4, 100])
    assert lo[0] == pytest.approx(0.0, abs=1e-12) and hi[0] == pytest.approx(2 * (z2 / 8) / (1 + z2 / 4))
    assert hi[0] == pytest.approx(0.4899, abs=1e-4)  # the textbook 0/4 upper bound
    # 50 of 100: centre 0.5, half = z/(1 + z²/100) sqrt(.25/100 + z²/40000) = 0.0962
    assert (lo[1], hi[1]) == (pytest.approx(0.5 - 0.09617, abs=1e-4), pytest.approx(0.5 + 0.09617, abs=1e-4))
    evals = {
        "a": pd.DataFrame(
            {
                "step": [9, 9],
                "rank": 0,
                "task": "t",
                "difficulty": ["1", "2"],
                "accuracy": [0.0, 0.5],
                "n": [4, 100],
            }
        ),
        "b": pd.DataFrame(
            {"step": [9], "rank": 0, "task": "t", "difficulty": ["1"], "accuracy": [0.25], "n": [4]}
        ),
    }
    fig = make_accuracy_by_difficulty_figure(evals)
    assert list(fig.layout.xaxis.ticktext) == ["1<br>n=4", "2<br>n=100"]  # the runs that have it agree on n
    assert list(fig.data[0].text) == ["0%", "50%"]
    assert list(fig.data[1].text) == ["25%", "not evaluated"]
    np.testing.assert_allclose(fig.data[0].error_y.array, [hi[0], hi[1] - 0.5], atol=1e-9)


def test_log_ticks_are_written_out_and_step_ticks_are_whole():
    vals, text = log_ticks(0.3, 20)
    assert text == ["0.5", "1", "2", "5", "10", "20"] and len(set(text)) == len(text)  # 0.5 never reads "5"
    assert log_ticks(1e-6, 10)[1] == ["1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1", "1", "10"]
    fig = go.Figure(go.Scatter(x=[0, 1, 2, 7], y=[1, 2, 3, 4]))
    integer_step_axis(fig, [0, 1, 2, 7])
    assert (fig.layout.xaxis.dtick, fig.layout.xaxis.tickformat) == (1, "d")  # a short run: every step
    integer_step_axis(fig, range(200))
    assert fig.layout.xaxis.tickformat == "~d"


def test_bucket_colours_do_not_depend_on_the_other_buckets():
    assert bucket_color("[0.00,0.25)") == bucket_colors(["[0.00,0.25)", "[0.25,1.00)"])["[0.00,0.25)"]
    assert (
        bucket_color("[0.00,0.25)")
        == bucket_colors(["[0.00,0.25)", "[0.25,0.50)", "[0.50,1.00)"])["[0.00,0.25)"]
    )
    assert bucket_color("residual") == "#9E9E9E"
    with pytest.raises(ValueError, match="bucket label"):
        bucket_color("low")


def test_paper_style_moves_subtitles_to_captions_and_makes_room_for_the_legend():
    fig = go.Figure([go.Scatter(x=[0, 1], y=[0, 1], name=f"a_rather_long_run_name_{i}") for i in range(6)])
    fig.update_layout(title="run<br><sup>19 of 20 analysed updates had a gradient</sup>")
    out = paper_style(fig, keep_title=True)
    assert out.layout.title.text == "run" and captions(out) == ["19 of 20 analysed updates had a gradient"]
    assert legend_height(out, 336) > legend_height(go.Figure(fig.data[:2]), 336)  # wrapped rows get room
    assert out.layout.yaxis.exponentformat == "e"  # never SI prefixes
