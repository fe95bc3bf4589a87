"""Synthetic runs in the tokengrad layout, for the dashboard tests and the dashboard benchmark.

    from synthetic_runs import write_synthetic_run        # tests/ is on sys.path under pytest
    write_synthetic_run(tmp / "grpo", n_steps=10, n_samples=4, n_tok=16, seed=0)
    write_synthetic_run(tmp / "dead", dead=1.0)         # every advantage 0: no step has a gradient
    write_synthetic_run(tmp / "lopti", lopti=True)      # two updates per step (AR-Lopti phases)

Writes RUN/meta.json and RUN/{table}/rank000/s*.parquet (schema.py) with pyarrow directly, vectorised with
numpy, so a run of millions of token rows is written in seconds. The values are random draws shaped like a
run (probabilities, coefficients, gradient norms); they exercise the read side and the pages, and are never
shown as results.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokengrad import schema

_WORDS = (
    "the",
    " the",
    " of",
    " and",
    " is",
    " a",
    " to",
    "\n",
    " ",
    " 3",
    " 5",
    " knight",
    " knave",
    " Alice",
    " Bob",
    " so",
    " therefore",
    " not",
    " true",
    " false",
    " answer",
    ".",
    ",",
    " if",
)


def _table(name: str, cols: dict[str, np.ndarray | pa.Array]) -> pa.Table:
    """A table with exactly the schema's fixed columns (missing ones null), cast to the schema's types."""
    sch = schema.arrow_schema(name)
    n = len(next(iter(cols.values())))
    arrays = [pa.array(cols[f.name]).cast(f.type) if f.name in cols else pa.nulls(n, f.type) for f in sch]
    return pa.Table.from_arrays(arrays, schema=sch)


def _write(run: Path, table: str, data: pa.Table, first: int, last: int) -> None:
    folder = run / schema.rank_dir(table, 0)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, folder / schema.file_name(first, last), compression="zstd")


def _vocab(size: int) -> list[str]:
    extra = [f" w{i}" for i in range(size - len(_WORDS))]
    return list(_WORDS) + extra


LOPTI_ETA = 0.5  # AR-Lopti's probability threshold: update 0 trains p < eta, update 1 the rest


def _tokens_chunk(
    rng: np.random.Generator,
    steps: np.ndarray,
    n_samples: int,
    n_tok: int,
    vocab: list[str],
    dead: np.ndarray,
    lopti: bool,
) -> pa.Table:
    """Token rows of several steps: n_samples completions of n_tok tokens per step, vectorised. Steps
    with dead[step] have every advantage 0 (so coef and the gradient norms are 0); with lopti every
    token is recorded in two updates, in the loss of the first when p < LOPTI_ETA, else of the second."""
    s = len(steps)
    n = s * n_samples * n_tok
    step = np.repeat(steps, n_samples * n_tok)
    sample = np.tile(np.repeat(np.arange(n_samples), n_tok), s)
    group = sample // 8
    position = np.tile(np.arange(n_tok), s * n_samples)
    # Most tokens of a trained policy are confident; a minority is uncertain (AR-Lopti Fig. 1 shape).
    prob = np.where(rng.random(n) < 0.7, rng.beta(12, 1, n), rng.beta(1.2, 2.5, n)).astype(np.float32)
    prob = np.clip(prob, 1e-6, 1.0)
    token_id = np.minimum((rng.pareto(1.2, n) * 3).astype(np.int32), len(vocab) - 1)
    adv_sample = rng.normal(0, 1, s * n_samples).astype(np.float32)
    advantage = np.where(dead[step], 0.0, np.repeat(adv_sample, n_tok)).astype(np.float32)
    weight = (1.0 - prob).astype(np.float32) + 0.5
    coef = (-advantage * weight / n_tok).astype(np.float32)
    sum_p2 = prob**2 + (1 - prob) ** 2 * 0.3
    unit = np.sqrt(np.maximum(1 - 2 * prob + sum_p2, 0)).astype(np.float32)
    logit_gn = np.abs(coef) * unit
    tokens = pa.DictionaryArray.from_arrays(pa.array(token_id), pa.array(vocab)).cast(pa.string())
    old_lp = np.log(prob) + rng.normal(0, 0.01, n).astype(np.float32)
    cols = {
        "step": step,
        "rank": np.zeros(n, np.int16),
        "update_id": np.zeros(n, np.int16),
        "pass_id": np.zeros(n, np.int16),
        "sample_id": sample,
        "group_id": group,
        "position": position,
        "token_id": token_id,
        "token": tokens,
        "in_loss": np.ones(n, bool),
        "logprob": np.log(prob),
        "old_logprob": old_lp,
        "prob": prob,
        "entropy": (1 - prob) * 2.0,
        "sum_p2": sum_p2,
        "logit_grad_unit": unit,
        "advantage": advantage,
        "weight": weight,
        "coef": coef,
        "ratio": np.exp(np.log(prob) - old_lp),
        "clipped": rng.random(n) < 0.02,
        "logit_grad_norm": logit_gn,
        "head_grad_norm": logit_gn * 20.0,
    }
    if not lopti:
        return _table("tokens", cols)
    phases = []
    for update, in_loss in ((0, prob < LOPTI_ETA), (1, prob >= LOPTI_ETA)):
        zero = np.where(in_loss, 1.0, 0.0).astype(np.float32)  # out of this phase's loss: no gradient
        phases.append(
            _table(
                "tokens",
                {
                    **cols,
                    "update_id": np.full(n, update, np.int16),
                    "pass_id": np.full(n, update, np.int16),
                    "in_loss": in_loss,
                    "coef": coef * zero,
                    "logit_grad_norm": logit_gn * zero,
                    "head_grad_norm": logit_gn * 20.0 * zero,
                },
            )
        )
    return pa.concat_tables(phases)


def _steps_table(
    rng: np.random.Generator, n_steps: int, tok_per_step: int, dead: np.ndarray, n_updates: int
) -> pa.Table:
    steps = np.arange(n_steps)
    grad = np.exp(rng.normal(0, 0.15, n_steps)) * (1 + 0.5 * np.exp(-steps / 50))
    grad[rng.choice(n_steps, max(1, n_steps // 100), replace=False)] *= 6  # a few spikes to find
    grad[dead] = 0.0
    reward = 0.2 + 0.6 * (1 - np.exp(-steps / (n_steps / 3 + 1))) + rng.normal(0, 0.03, n_steps)
    z = np.zeros(n_steps)
    return _table(
        "steps",
        {
            "step": steps,
            "rank": z,
            "loss": rng.normal(0, 0.05, n_steps),
            "grad_norm": grad,
            "n_updates": z + n_updates,
            "reward_mean": reward,
            "reward_std": np.where(dead, 0.0, 0.3),
            "entropy_mean": 0.6 * np.exp(-steps / n_steps),
            "kl": 0.01 * steps / max(n_steps, 1),
            "clip_frac": np.abs(rng.normal(0.02, 0.005, n_steps)),
            "weight_mean": z + 0.9,
            "weight_min": z + 0.5,
            "weight_max": z + 1.5,
            "lr": z + 1e-6,
            "n_tokens": z + tok_per_step,
            "n_nonfinite": z,
            "time_step": z + 1.0,
            "time_record": z + 0.01,
        },
    )


def _layers_table(steps_tbl: pa.Table, n_layers: int) -> pa.Table:
    total = steps_tbl.column("grad_norm").to_numpy()
    names = [schema.TOTAL_LAYER, "model.embed_tokens"] + [f"model.layers.{i}" for i in range(n_layers)]
    share = np.linspace(1.0, 0.3, len(names))
    n = len(total)
    return _table(
        "layers",
        {
            "step": np.repeat(np.arange(n), len(names)),
            "rank": np.zeros(n * len(names)),
            "update_id": np.zeros(n * len(names)),
            "layer": np.tile(names, n),
            "grad_norm": (total[:, None] * share[None, :]).ravel(),
        },
    )


def _buckets_table(rng: np.random.Generator, steps: np.ndarray, dead: np.ndarray, lopti: bool) -> pa.Table:
    """One analysis per analysed step (per update with lopti: update 0 holds the p < 0.5 buckets' tokens,
    update 1 the others); dead steps have zero norms and undefined (NaN) shares."""
    if not lopti:
        return _bucket_rows(rng, steps, dead[steps], 0, np.ones(5, bool))
    low = np.array([True, True, False, False, False])
    return pa.concat_tables(
        [_bucket_rows(rng, steps, dead[steps], 0, low), _bucket_rows(rng, steps, dead[steps], 1, ~low)]
    )


def _bucket_rows(
    rng: np.random.Generator, steps: np.ndarray, dead: np.ndarray, update: int, in_phase: np.ndarray
) -> pa.Table:
    edges = schema.DEFAULT_BUCKET_EDGES
    labels = [schema.bucket_label(lo, hi) for lo, hi in zip(edges[:-1], edges[1:])] + [schema.RESIDUAL_BUCKET]
    k = len(labels)
    counts = np.array([80, 70, 100, 750, 0]) * in_phase
    token_share = counts / counts.sum()
    # Low-probability tokens carry most of the update although they are few (arXiv 2505.12929 Fig. 1).
    upd = np.array([0.45, 0.25, 0.17, 0.13, 0.0]) * in_phase
    upd = upd / upd.sum()
    n = len(steps)
    jitter = rng.normal(0, 0.02, (n, k)) * in_phase
    live = np.repeat(~dead, k)
    share = np.where(live, np.tile(upd, n) + jitter.ravel(), np.nan)
    return _table(
        "buckets",
        {
            "step": np.repeat(steps, k),
            "rank": np.zeros(n * k),
            "update_id": np.full(n * k, update),
            "bucket": np.tile(labels, n),
            "lo": np.tile(list(edges[:-1]) + [np.nan], n),
            "hi": np.tile(list(edges[1:]) + [np.nan], n),
            "n_tokens": np.tile(counts, n),
            "token_share": np.tile(token_share, n),
            "grad_norm": np.where(live, np.nan_to_num(share).clip(0) * 3, 0.0),
            "update_share": share,
            "cos_to_total": np.where(live, np.tile(upd + 0.2, n), np.nan),
            "dprob_mean": np.tile([0.05, 0.03, 0.01, 0.001, np.nan], n),
            "correct_ratio": np.tile([0.9, 0.8, 0.7, 0.6, np.nan], n),
        },
    )


def _samples_table(rng: np.random.Generator, n_steps: int, n_samples: int, n_tok: int) -> pa.Table:
    n = n_steps * n_samples
    sample = np.tile(np.arange(n_samples), n_steps)
    reward = (rng.random(n) < 0.5).astype(float)
    return _table(
        "samples",
        {
            "step": np.repeat(np.arange(n_steps), n_samples),
            "rank": np.zeros(n),
            "sample_id": sample,
            "group_id": sample // 8,
            "prompt": pa.array(["Who is a knight?"] * n),
            "completion": pa.array(["Alice is a knight, so Bob is a knave."] * n),
            "reward": reward,
            "advantage": reward - 0.5,
            "length": np.full(n, n_tok),
            "task": pa.array(["kk"] * n),
            "difficulty": pa.array([str(3 + i % 3) for i in range(n)]),
        },
    )


def _evals_table(n_steps: int, every: int) -> pa.Table:
    steps = np.arange(0, n_steps, every)
    diffs = ["3", "4", "5"]
    n = len(steps) * len(diffs)
    acc = np.array([[0.3 + 0.4 * s / n_steps - 0.1 * d for d in range(3)] for s in steps]).ravel()
    return _table(
        "evals",
        {
            "step": np.repeat(steps, 3),
            "rank": np.zeros(n),
            "task": pa.array(["kk"] * n),
            "difficulty": pa.array(diffs * len(steps)),
            "accuracy": acc.clip(0, 1),
            "n": np.full(n, 20),
        },
    )


def write_meta(
    run: Path, name: str, n_steps: int, bucket_every: int, finished: bool = True, lopti: bool = False
) -> None:
    p = np.linspace(0, 1, 21)
    meta = {
        "schema_version": schema.SCHEMA_VERSION,
        "tokengrad_version": "0.1.0",
        "run_name": name,
        "created": "2026-01-01T00:00:00",
        "config": {"steps": n_steps, "bucket_every": bucket_every},
        "weighting": {
            "name": "ar_lopti" if lopti else "synthetic",
            "params": {"eta": LOPTI_ETA, "low_first": True} if lopti else {"offset": 0.5},
            "curve": {"p": p.tolist(), "w": (1.5 - p).tolist()},
        },
        "model": "synthetic",
        "tokenizer": "synthetic",
        "world_size": 1,
        "rows_dropped": {},
        "finished": finished,
    }
    (run / schema.META_FILE).write_text(json.dumps(meta, indent=2))


def write_synthetic_run(
    run: str | Path,
    n_steps: int = 10,
    n_samples: int = 4,
    n_tok: int = 16,
    steps_per_file: int = 50,
    bucket_every: int = 2,
    eval_every: int = 5,
    n_layers: int = 4,
    seed: int = 0,
    tables: tuple[str, ...] = tuple(schema.TABLES),
    dead: float = 0.0,
    lopti: bool = False,
) -> Path:
    """Write a synthetic run of n_steps * n_samples * n_tok token rows; returns the run directory.

    `tables` limits which tables are written (tests use it to build runs with tables missing). A share
    `dead` of the steps (every step at 1.0; the first ones after step 0 otherwise) has every advantage 0,
    as when all completions of every group got the same reward; `lopti` records two updates per step.
    """
    run = Path(run)
    run.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    write_meta(run, run.name, n_steps, bucket_every, lopti=lopti)
    dead_steps = np.arange(n_steps) < round(dead * n_steps)
    if 0 < dead < 1:  # keep step 0 live, so a partly dead run starts with a gradient
        dead_steps = np.roll(dead_steps, 1)
    vocab = _vocab(2000)
    if "tokens" in tables:
        for first in range(0, n_steps, steps_per_file):
            last = min(first + steps_per_file, n_steps) - 1
            chunk = _tokens_chunk(rng, np.arange(first, last + 1), n_samples, n_tok, vocab, dead_steps, lopti)
            _write(run, "tokens", chunk, first, last)
    steps_tbl = _steps_table(rng, n_steps, n_samples * n_tok, dead_steps, 2 if lopti else 1)
    builders = {
        "steps": lambda: steps_tbl,
        "layers": lambda: _layers_table(steps_tbl, n_layers),
        "buckets": lambda: _buckets_table(rng, np.arange(0, n_steps, bucket_every), dead_steps, lopti),
        "samples": lambda: _samples_table(rng, n_steps, n_samples, n_tok),
        "evals": lambda: _evals_table(n_steps, eval_every),
    }
    for name, build in builders.items():
        if name in tables and not (name == "buckets" and bucket_every <= 0):
            _write(run, name, build(), 0, n_steps - 1)
    return run
