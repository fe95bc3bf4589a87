"""The tokengrad run format: the one place that names tables, columns, dtypes and the layout (the tables'
columns themselves are in tokengrad.schema.columns).

A run is a directory::

    RUN/meta.json                                  # see META_KEYS; written by rank 0
    RUN/ranks/rank{r:03d}.json                     # per-rank status: rows_dropped, last_step, finished
    RUN/{table}/rank{r:03d}/s{first:08d}-{last:08d}.parquet

Every table file holds the rows of the steps first..last of one rank. The writer commits one small file
per step (atomically: temp file + rename) and later compacts runs of small files into one larger file
with the covering step range; a reader keeps, for each rank, only files whose range is not contained in
another file's range, so a reader racing a compaction never double counts.

Imported by the writer, the reader, the CLI, the TRL integration and the dashboard: change a column
here and bump SCHEMA_VERSION.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pyarrow as pa

# the tables' columns, with their types and meanings (one module of this package, kept apart for size)
from tokengrad.schema.columns import (  # noqa: E402, F401
    BUCKETS,
    EVALS,
    EXTENSIBLE,
    LAYERS,
    PROB_BINS,
    REPLAY_K,
    SAMPLES,
    STEPS,
    TABLES,
    TOKENS,
    VOCAB,
    WHATIF,
    Column,
)

SCHEMA_VERSION = 8
# Version history: 2 added tokens.update_share / dlogprob_pred / dlogprob / selected_by, steps.n_token_rows
# and the prob_bins and vocab tables (attribution and budgeted recording); 3 added tokens.rollout_logprob,
# steps.rollout_mismatch / groups_generated / groups_kept / gen_rounds / ds_grad_norm and meta temperature
# (the sampler's distribution, dynamic-sampling refills, DeepSpeed); 4 added tokens.entropy_share /
# dentropy_pred / dentropy, steps.dentropy_mean_pred / dentropy_mean / entropy_grad_dot /
# entropy_share_residual / cov_logprob_adv and prob_bins.sum_entropy_share (entropy attribution), and the
# rollout engine's side (tokengrad.objective.rollout_correction): tokens.is_weight / masked / masked_by, the
# gap and IS-weight metrics in steps, samples.rollout_seq_log_ratio / rollout_gap_mean. Older runs read with
# the newer columns null and tables empty. 5 added steps.rs_masked_tokens / rs_masked_sequences and the
# mask reason rs_mask (verl's rejection sampling, tokengrad.integrations.verl.rollout), and steps.spike_z /
# grad_norm_without_top1 / top5 / top20 (the replay of a gradient spike, Attribution(on_spike=True)); 6
# added tokens.policy_version / trainer_version (which weights sampled a sequence and which scored the
# row: the staleness of an off-policy token apart from the engine's mismatch, tokengrad.read.rollout_queries);
# 7 added steps.loss_scale (fp16 gradient scaling: coef and norms are recorded unscaled, and an update the
# scaler skipped for overflow is told apart from a non-finite loss); 8 added the whatif table (the gradient
# each requested weighting rule would have produced from the same parameters on the same passes, WhatIf).

META_FILE = "meta.json"
RANKS_DIR = "ranks"
FILE_RE = re.compile(r"^s(\d{8})-(\d{8})\.parquet$")

# Default probability buckets: AR-Lopti Fig. 1 (arXiv 2505.12929) uses [0, .25, .5, .75, 1].
# Why a host trainer removed a token's gradient (tokens.masked_by; several joined by "+"), in bit order:
# TRL's IS sequence / token mask (vllm_importance_sampling_mode), its off-policy sequence mask
# (off_policy_mask_threshold, DeepSeek-V3.2) and its entropy mask (top_entropy_quantile, arXiv 2506.01939);
# verl's IcePop weights (rollout_is_threshold "lower_upper": weight 0 outside the interval) count as
# is_token_mask / is_sequence_mask, and verl's rejection sampling (algorithm.rollout_correction.rollout_rs:
# the token's or its sequence's divergence from the rollout exceeded rollout_rs_threshold) is rs_mask.
MASK_REASONS = ("is_sequence_mask", "is_token_mask", "off_policy_mask", "entropy_mask", "rs_mask")

DEFAULT_BUCKET_EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)
DECILE_BUCKET_EDGES = tuple(round(i / 10, 1) for i in range(11))
RESIDUAL_BUCKET = "residual"  # bucket label of the gradient part not built on log pi (e.g. entropy bonus)
TOTAL_LAYER = "total"  # layer name of the whole-model gradient norm in the layers table

META_KEYS = (
    "schema_version",
    "tokengrad_version",
    "run_name",
    "created",
    "config",
    "weighting",
    "model",
    "tokenizer",
    "world_size",
    "rows_dropped",
    "finished",
    "temperature",
)


def arrow_schema(table: str) -> pa.Schema:
    """The pyarrow schema of a table's fixed columns."""
    return pa.schema([pa.field(c.name, c.type, c.nullable) for c in _columns(table)])


def column_names(table: str) -> list[str]:
    return [c.name for c in _columns(table)]


def _columns(table: str) -> list[Column]:
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; known tables: {sorted(TABLES)}")
    return TABLES[table]


def file_name(first: int, last: int) -> str:
    return f"s{first:08d}-{last:08d}.parquet"


def rank_dir(table: str, rank: int) -> str:
    return f"{table}/rank{rank:03d}"


def parse_file_name(name: str) -> tuple[int, int] | None:
    m = FILE_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def bucket_label(lo: float, hi: float) -> str:
    return f"[{lo:.2f},{hi:.2f})"


def describe() -> str:
    """Markdown description of every table (used by `tokengrad inspect --schema` and the docs)."""
    out = [f"# tokengrad run format, schema version {SCHEMA_VERSION}\n"]
    for table, cols in TABLES.items():
        out.append(f"\n## {table}\n\n| column | type | meaning |\n|---|---|---|")
        out += [f"| {c.name} | {c.type} | {c.doc} |" for c in cols]
    return "\n".join(out) + "\n"


# ---- attribute-style column names -------------------------------------------------------------------
# `df[TOK.prob]` is "prob"; a name missing from the schema raises AttributeError, so a renamed column fails
# loudly wherever it is used instead of silently selecting nothing. Writer, reader, CLI, figures and app
# share these.
def _names(table: str) -> SimpleNamespace:
    return SimpleNamespace(**{c: c for c in column_names(table)})


TOK = _names("tokens")
STEP = _names("steps")
LAYER = _names("layers")
BUCKET = _names("buckets")
SAMPLE = _names("samples")
EVAL = _names("evals")
PBIN = _names("prob_bins")
VOCAB_COL = _names("vocab")
WHAT = _names("whatif")
WHATIF_ALL = "all"  # whatif.bucket of the whole counterfactual update

# Columns of the binned/aggregated frames that tokengrad.read.queries returns (not stored in the run format).
BIN = SimpleNamespace(lo="lo", hi="hi", count="count")

# Extra columns of the extensible tables (EXTENSIBLE) that a producer writes by name and a reader (the doctor)
# looks for: not fixed columns, so a run may lack them; named here so the reader asks for the name written.
SAMPLE_EXTRA = SimpleNamespace(
    correct="correct",  # built-in trainer (train/sampling.py): the task's verifiable check passed, 0/1
)
STEP_EXTRA = SimpleNamespace(
    # TRL's completions/clipped_ratio (the share of completions cut at max_completion_length), as the TRL
    # attach names a logged metric: trl_ + its name (integrations/trl/logs.py)
    trl_completions_clipped_ratio="trl_completions_clipped_ratio",
)
