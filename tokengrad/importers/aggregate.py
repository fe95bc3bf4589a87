"""The steps-table row of an imported step, computed from its token and sample rows with the definitions the
recorder uses (tokengrad.schema.columns; the gap metrics are tokengrad.objective.rollout_correction's own
function), so an imported step and a recorded one mean the same numbers.

    steps = step_row(tokens, samples)      # {"n_tokens": [412], "entropy_mean": [0.83], ...}
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tokengrad.objective.rollout_correction import gap_metrics


def step_row(tokens: dict[str, list] | None, samples: dict[str, list] | None) -> dict[str, list]:
    """One steps row (column -> [value]) from a step's token columns and sample columns (either may be
    None); a statistic whose input the source did not record is left out (null)."""
    row: dict[str, float | int] = {}
    if tokens and tokens.get("in_loss"):
        row.update(_token_stats(tokens))
    if samples and samples.get("reward"):
        row.update(_reward_stats(samples["reward"]))
    return {k: [v] for k, v in row.items()}


def _floats(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _token_stats(tokens: dict[str, list]) -> dict:
    loss = np.array(tokens["in_loss"], dtype=bool)  # [K] rows of the step
    out: dict = {"n_tokens": int(loss.sum()), "n_token_rows": int(loss.size)}
    if "entropy" in tokens:
        ent = _floats(tokens["entropy"])[loss]
        if np.isfinite(ent).any():
            out["entropy_mean"] = float(np.nanmean(ent))
    if "weight" in tokens:
        w = _floats(tokens["weight"])[loss]
        if np.isfinite(w).any():
            out.update(weight_mean=float(np.nanmean(w)), weight_min=float(np.nanmin(w)))
            out["weight_max"] = float(np.nanmax(w))
    if "old_logprob" in tokens and "rollout_logprob" in tokens:
        out.update(_gap(tokens, loss))
    return out


def _gap(tokens: dict[str, list], loss: np.ndarray) -> dict:
    """gap_metrics over the step's sequences: [N, T] tensors padded with masked NaN."""
    old = _floats(tokens["old_logprob"])
    if not np.isfinite(old[loss]).any():
        return {}
    mu = _floats(tokens["rollout_logprob"])
    ids = np.array(tokens["sample_id"])
    seqs = [np.flatnonzero(ids == s) for s in dict.fromkeys(ids.tolist())]
    width = max(len(s) for s in seqs)
    pad = np.full((len(seqs), width), np.nan)
    old_p, mu_p, mask = pad.copy(), pad.copy(), np.zeros((len(seqs), width), dtype=bool)
    for i, s in enumerate(seqs):
        old_p[i, : len(s)], mu_p[i, : len(s)], mask[i, : len(s)] = old[s], mu[s], loss[s]
    mask &= np.isfinite(old_p)  # a loss token without a trainer log-prob has no gap either
    metrics = gap_metrics(
        torch.from_numpy(np.nan_to_num(old_p)),  # [N, T]
        torch.from_numpy(mu_p),  # [N, T]
        torch.from_numpy(mask),  # [N, T]
    )
    return {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}


def _reward_stats(rewards: list) -> dict:
    r = _floats(rewards)
    r = r[np.isfinite(r)]
    if not r.size:
        return {}
    # the built-in trainer's convention (tokengrad.train.sampling): the unbiased std, 0 for one completion
    return {"reward_mean": float(r.mean()), "reward_std": float(r.std(ddof=1)) if r.size > 1 else 0.0}
