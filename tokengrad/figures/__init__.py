"""Pure plotly figure builders shared by the dashboard (app/) and `tokengrad export`. No streamlit, no torch.

Every builder takes run-format tables (pandas DataFrames, keyed by run name where several runs overlay)
or the aggregates of tokengrad.queries, and returns a plotly Figure (or an HTML string / DataFrame).
"""

from tokengrad.figures.buckets import (
                      bucket_shares,
                      bucket_steps,
                      make_bucket_dprob_figure,
                      make_bucket_grad_norm_figure,
                      make_bucket_share_figure,
                      make_bucket_steps_figure,
                      make_grad_vs_prob_figure,
                      make_prob_histogram_figure,
                      make_weight_curve_figure,
                      reference_curves,
                      weight_curve,
)
from tokengrad.figures.evals import (
                      accuracy_by_difficulty,
                      accuracy_over_steps,
                      make_accuracy_by_difficulty_figure,
                      make_accuracy_over_steps_figure,
)
from tokengrad.figures.overview import (
                      OVERVIEW_METRICS,
                      grad_norm_series,
                      layer_names,
                      make_grad_norm_figure,
                      make_layer_grad_norm_figure,
                      make_layer_heatmap_figure,
                      make_metric_figure,
                      make_overview_figure,
                      metric_label,
                      step_series,
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
from tokengrad.figures.tokens import make_token_figure, token_html

__all__ = [
    "DASHBOARD_TEMPLATE",
    "DEFAULT_SPIKE_K",
    "OVERVIEW_METRICS",
    "PAPER_TEMPLATE",
    "accuracy_by_difficulty",
    "accuracy_over_steps",
    "bucket_shares",
    "bucket_steps",
    "debiased_ema",
    "empty_figure",
    "find_spikes",
    "grad_norm_series",
    "layer_names",
    "make_accuracy_by_difficulty_figure",
    "make_accuracy_over_steps_figure",
    "make_bucket_dprob_figure",
    "make_bucket_grad_norm_figure",
    "make_bucket_share_figure",
    "make_bucket_steps_figure",
    "make_grad_norm_figure",
    "make_grad_vs_prob_figure",
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
    "reference_curves",
    "robust_threshold",
    "run_color",
    "run_colors",
    "step_series",
    "summarize_run",
    "token_html",
    "weight_curve",
]
