"""Runs for the doctor's tests: a healthy GRPO-shaped run whose tables a test edits before they are written,
so each pathology starts at a known step.

    from doctor_runs import write_doctor_run
    def kl(t): t["steps"].loc[t["steps"].step >= 40, "kl"] = 2.0
    write_doctor_run(tmp / "kl", edit=kl)              # KL blows up at step 40

Tables are pandas frames (steps, samples, tokens, buckets, layers) written with the schema's types; extra
columns (samples.correct) are kept. The values are seeded random draws shaped like a
healthy run: every detector is silent on the unedited run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tokengrad import schema

EOS = 2
MAX_NEW_TOKENS = 64
WORDS = [f"w{i}" for i in range(200)]


def _steps(rng: np.random.Generator, n: int) -> pd.DataFrame:
    step = np.arange(n)
    return pd.DataFrame(
        {
            "step": step,
            "rank": 0,
            "loss": rng.normal(0, 0.01, n),
            "grad_norm": np.exp(rng.normal(0, 0.2, n)),
            "n_updates": 1,
            "reward_mean": rng.uniform(0.4, 0.6, n),
            "reward_std": rng.uniform(0.4, 0.5, n),
            "rollout_mismatch": rng.uniform(0.8e-6, 1.2e-6, n),
            "entropy_mean": 0.5 + rng.normal(0, 0.02, n),
            "kl": 0.02 + rng.normal(0, 0.003, n),
            "clip_frac": rng.uniform(0.02, 0.08, n),
            "weight_mean": 1.0,
            "weight_min": 1.0,
            "weight_max": 1.0,
            "lr": 1e-5,
            "n_tokens": 320,
            "n_nonfinite": 0,
            "n_token_rows": 320,
            "time_step": 1.0 + rng.normal(0, 0.03, n),
            "time_record": 0.01,
        }
    )


def _samples(rng: np.random.Generator, n: int, groups: int, size: int) -> pd.DataFrame:
    m = n * groups * size
    reward = (rng.random(m) < 0.5).astype(float)
    length = rng.integers(15, 26, m)
    text = [" ".join(rng.choice(WORDS, k)) for k in length]
    sample = np.tile(np.arange(groups * size), n)
    return pd.DataFrame(
        {
            "step": np.repeat(np.arange(n), groups * size),
            "rank": 0,
            "sample_id": sample,
            "group_id": sample // size,
            "prompt": "p",
            "completion": text,
            "reward": reward,
            "advantage": 0.0,
            "length": length,
            "task": "t",
            "difficulty": "1",
            "correct": reward.astype(int),
        }
    )


def tokens_of(samples: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """One token row per completion token (length rows, the last one EOS unless the sample is marked
    `truncated`), with advantages from the group-normalised rewards."""
    s = samples.copy()
    grp = s.groupby(["step", "group_id"])["reward"]
    s["advantage"] = (s["reward"] - grp.transform("mean")) / (grp.transform("std").fillna(0) + 1e-6)
    lengths = s["length"].to_numpy().astype(int)
    idx = np.repeat(np.arange(len(s)), lengths)
    pos = np.concatenate([np.arange(k) for k in lengths])
    n = idx.size
    prob = np.where(rng.random(n) < 0.7, rng.beta(12, 1, n), rng.beta(1.2, 2.5, n)).clip(1e-4, 1)
    token_id = rng.integers(3, 200, n)
    trunc = s["truncated"].to_numpy() if "truncated" in s.columns else np.zeros(len(s), bool)
    last = pos == lengths[idx] - 1
    token_id[last & ~trunc[idx]] = EOS
    adv = s["advantage"].to_numpy()[idx]
    coef = -adv / lengths[idx]
    unit = np.sqrt(np.clip(1 - 2 * prob + prob**2 + (1 - prob) ** 2 * 0.3, 0, None))
    old = np.log(prob)
    return pd.DataFrame(
        {
            "step": s["step"].to_numpy()[idx],
            "rank": 0,
            "update_id": 0,
            "pass_id": 0,
            "sample_id": s["sample_id"].to_numpy()[idx],
            "group_id": s["group_id"].to_numpy()[idx],
            "position": pos,
            "token_id": token_id,
            "token": [f"t{t}" for t in token_id],
            "in_loss": True,
            "logprob": old,
            "old_logprob": old,
            "rollout_logprob": old + rng.normal(0, 1e-6, n),
            "prob": prob,
            "entropy": (1 - prob) * 2,
            "advantage": adv,
            "weight": 1.0,
            "coef": coef,
            "ratio": 1.0,
            "clipped": False,
            "logit_grad_norm": np.abs(coef) * unit,
        }
    )


def _buckets(n: int, every: int) -> pd.DataFrame:
    rows = []
    edges = schema.DEFAULT_BUCKET_EDGES
    token_share = (0.05, 0.1, 0.15, 0.7)
    update_share = (0.2, 0.2, 0.2, 0.4)
    for step in range(0, n, every):
        for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
            rows.append(
                dict(
                    step=step,
                    rank=0,
                    update_id=0,
                    bucket=schema.bucket_label(lo, hi),
                    lo=lo,
                    hi=hi,
                    n_tokens=int(320 * token_share[i]),
                    token_share=token_share[i],
                    grad_norm=1.0,
                    update_share=update_share[i],
                    cos_to_total=0.5,
                    dprob_mean=0.01,
                    correct_ratio=0.7,
                )
            )
    return pd.DataFrame(rows)


def _arrow(table: str, df: pd.DataFrame) -> pa.Table:
    """The schema's fixed columns with their types (missing ones null), then the frame's extra columns."""
    sch = schema.arrow_schema(table)
    n = len(df)
    arrays = [pa.array(df[f.name]).cast(f.type) if f.name in df.columns else pa.nulls(n, f.type) for f in sch]
    fixed = pa.Table.from_arrays(arrays, schema=sch)
    for col in (c for c in df.columns if c not in sch.names and c != "truncated"):
        fixed = fixed.append_column(col, pa.array(df[col]))
    return fixed


def write_doctor_run(
    run: str | Path,
    n_steps: int = 60,
    groups: int = 4,
    group_size: int = 4,
    bucket_every: int = 5,
    seed: int = 0,
    edit: Callable[[dict], None] | None = None,
    meta: dict | None = None,
) -> Path:
    """Write the run; `edit(tables)` changes the frames first (tables["tokens"] is rebuilt from the samples
    after the edit unless the edit set it itself)."""
    run = Path(run)
    run.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tables = {
        "steps": _steps(rng, n_steps),
        "samples": _samples(rng, n_steps, groups, group_size),
        "buckets": _buckets(n_steps, bucket_every),
    }
    if edit is not None:
        edit(tables)
    if "tokens" not in tables:
        tables["tokens"] = tokens_of(tables["samples"], rng)
    if "layers" not in tables:
        st = tables["steps"]
        tables["layers"] = pd.DataFrame(
            {
                "step": st["step"],
                "rank": 0,
                "update_id": 0,
                "layer": schema.TOTAL_LAYER,
                "grad_norm": st["grad_norm"],
            }
        )
    for name, df in tables.items():
        folder = run / schema.rank_dir(name, 0)
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(_arrow(name, df), folder / schema.file_name(0, n_steps - 1))
    info = {
        "schema_version": schema.SCHEMA_VERSION,
        "tokengrad_version": "0.1.0",
        "run_name": run.name,
        "created": "2026-01-01T00:00:00",
        "config": {"steps": n_steps, "max_new_tokens": MAX_NEW_TOKENS},
        "weighting": {"name": "grpo", "params": {}},
        "model": "synthetic",
        "tokenizer": "synthetic",
        "world_size": 1,
        "rows_dropped": {},
        "finished": True,
        **(meta or {}),
    }
    (run / schema.META_FILE).write_text(json.dumps(info))
    return run
