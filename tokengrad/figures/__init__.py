"""Pure plotly figure builders shared by the dashboard (app/) and `tokengrad export`. No streamlit, no torch.

Every builder takes run-format tables (pandas DataFrames, keyed by run name where several runs overlay)
or the aggregates of tokengrad.read.queries, and returns a plotly Figure (or an HTML string / DataFrame).
Modules: liveness (steps without a gradient), smoothing, curves (per-step metrics), gradnorms, buckets
(bucket analysis; bucket_updates: which analysed updates its figures average), headline (the share of
the update by bucket, runs overlaid), probability (gradient against token probability), evals, tokens,
wordclouds, summary, tables (a figure's data as a table), style, export.
"""

from tokengrad.figures.bucket_updates import analysed_updates, analysis_note
from tokengrad.figures.buckets import (
    bucket_shares,
    bucket_steps,
    make_bucket_dprob_figure,
    make_bucket_grad_norm_figure,
    make_bucket_share_figure,
    make_bucket_steps_figure,
    make_weight_curve_figure,
    weight_curve,
)
from tokengrad.figures.curves import (
    OVERVIEW_METRICS,
    X_AXES,
    make_metric_figure,
    make_overview_figure,
    metric_label,
    plottable_metrics,
    step_series,
)
from tokengrad.figures.evals import (
    accuracy_by_difficulty,
    accuracy_over_steps,
    make_accuracy_by_difficulty_figure,
    make_accuracy_over_steps_figure,
)
from tokengrad.figures.gradnorms import (
    grad_norm_series,
    layer_names,
    make_grad_norm_figure,
    make_layer_grad_norm_figure,
    make_layer_heatmap_figure,
    top_layers,
)
from tokengrad.figures.headline import make_headline_figure
from tokengrad.figures.liveness import dead_mask, dead_note, live_mask
from tokengrad.figures.probability import (
    make_grad_vs_prob_figure,
    make_gradient_share_figure,
    make_prob_histogram_figure,
    reference_curves,
    with_update_shares,
)
from tokengrad.figures.smoothing import DEFAULT_SPIKE_K, debiased_ema, find_spikes, robust_threshold
from tokengrad.figures.style import (
    DASHBOARD_TEMPLATE,
    PAPER_TEMPLATE,
    empty_figure,
    paper_size,
    paper_style,
    run_color,
    run_colors,
)
from tokengrad.figures.summary import make_summary_table, summarize_run
from tokengrad.figures.tables import figure_table
from tokengrad.figures.tokens import make_token_figure, token_html

__all__ = [
    "DASHBOARD_TEMPLATE",
    "DEFAULT_SPIKE_K",
    "OVERVIEW_METRICS",
    "PAPER_TEMPLATE",
    "X_AXES",
    "accuracy_by_difficulty",
    "accuracy_over_steps",
    "analysed_updates",
    "analysis_note",
    "bucket_shares",
    "bucket_steps",
    "dead_mask",
    "dead_note",
    "debiased_ema",
    "empty_figure",
    "figure_table",
    "find_spikes",
    "grad_norm_series",
    "layer_names",
    "live_mask",
    "make_accuracy_by_difficulty_figure",
    "make_accuracy_over_steps_figure",
    "make_bucket_dprob_figure",
    "make_bucket_grad_norm_figure",
    "make_bucket_share_figure",
    "make_bucket_steps_figure",
    "make_grad_norm_figure",
    "make_grad_vs_prob_figure",
    "make_gradient_share_figure",
    "make_headline_figure",
    "with_update_shares",
    "make_layer_grad_norm_figure",
    "make_layer_heatmap_figure",
    "make_metric_figure",
    "make_overview_figure",
    "make_prob_histogram_figure",
    "make_summary_table",
    "make_token_figure",
    "make_weight_curve_figure",
    "metric_label",
    "paper_size",
    "paper_style",
    "plottable_metrics",
    "reference_curves",
    "robust_threshold",
    "run_color",
    "run_colors",
    "step_series",
    "summarize_run",
    "token_html",
    "top_layers",
    "weight_curve",
]
