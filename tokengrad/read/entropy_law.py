"""The entropy law of arXiv 2602.03392 (Wang et al., "On the Entropy Dynamics in Reinforcement Fine-Tuning
of LLMs", Thm. 3.2) checked per token on runs with entropy attribution (Attribution(entropy=True)):

    df = entropy_law(run, steps=(0, 99))   # one row per loss token: p, H, dlogprob, dentropy, the law
    entropy_law_fit(df)                    # Pearson / Spearman / slope / sign agreement per step, pooled

A logit step eps on the sampled token k of a softmax changes the entropy of that distribution by

    dH = -eps * S*,   S* = p_k (H + log p_k),   + O(eps^2)

(dH/dz_k = -sum_j p_j (delta_jk - p_k)(log p_j + 1) = -p_k (log p_k + H)). The same step moves the token's
own log-prob by eps (1 - p_k) to first order, so the step each recorded token took is read off its measured
dlogprob: eps = dlogprob / (1 - p). In a network every logit of the position moves (the tokens share the
parameters), so how well -eps S* tracks the measured `dentropy` is what the check measures; `dentropy_pred`
(<grad H_t, delta>, the recorder's exact first order along the applied update) is the reference for the
same change, so law vs dentropy_pred isolates the one-logit picture and dentropy_pred vs dentropy the
second-order remainder. Statistics with numpy (Spearman = Pearson of the ranks, as scipy.stats.spearmanr).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokengrad.schema import TOK

LAW_PRED = "dentropy_law"  # query column: -eps * S* (not stored)
LAW_MIN_ONE_MINUS_P = 1e-4  # tokens with 1 - p below this: eps is a float32 rounding ratio, left out
LAW_COLUMNS = (
    TOK.step,
    TOK.update_id,
    TOK.sample_id,
    TOK.position,
    TOK.prob,
    TOK.entropy,
    TOK.advantage,
    TOK.dlogprob,
    TOK.dentropy_pred,
    TOK.dentropy,
)
FIT_COLUMNS = ("n", "pearson", "spearman", "slope", "sign_agree")


def entropy_law_s_star(prob, entropy) -> np.ndarray:
    """[N] S* = p (H + log p) of arXiv 2602.03392 Thm. 3.2 (p: the token's probability, H: its position's
    entropy in nats). S* > 0 where log p > -H: a likely token, whose rise lowers the entropy."""
    p = np.asarray(prob, dtype=float)  # [N]
    return p * (np.asarray(entropy, dtype=float) + np.log(p))


def entropy_law_pred(prob, entropy, eps) -> np.ndarray:
    """[N] the law's first-order entropy change -eps S* for a logit step eps on the token."""
    return -np.asarray(eps, dtype=float) * entropy_law_s_star(prob, entropy)


def entropy_law(run, steps: tuple[int, int] | None = None) -> pd.DataFrame:
    """One row per loss token of the entropy-attributed updates that had a gradient (finite entropy_share,
    dlogprob, dentropy, prob and entropy; 1 - p at least LAW_MIN_ONE_MINUS_P): LAW_COLUMNS plus the logit
    step `eps` = dlogprob / (1 - p), `s_star` and the law's prediction `dentropy_law` = -eps S*. An update
    without a gradient moves nothing but rounding (its entropy_share is NaN), so it is left out. Empty
    without entropy attribution."""
    conds = [TOK.in_loss, f"1 - {TOK.prob} >= ?"]
    conds += [
        f"isfinite({c})" for c in (TOK.entropy_share, TOK.dlogprob, TOK.dentropy, TOK.prob, TOK.entropy)
    ]
    params: list = [LAW_MIN_ONE_MINUS_P]
    if steps is not None:
        lo, hi = (int(s) for s in steps)
        if lo > hi:
            raise ValueError(f"steps must be (lo, hi) with lo <= hi, got {steps}")
        conds.append(f"{TOK.step} BETWEEN ? AND ?")
        params += [lo, hi]
    order = f"{TOK.step}, {TOK.update_id}, {TOK.sample_id}, {TOK.position}"
    q = f"SELECT {', '.join(LAW_COLUMNS)} FROM tokens WHERE {' AND '.join(conds)} ORDER BY {order}"
    df = run.sql(q, params)
    p = df[TOK.prob].to_numpy(float)  # [N]
    df["eps"] = df[TOK.dlogprob].to_numpy(float) / (1 - p)
    df["s_star"] = entropy_law_s_star(p, df[TOK.entropy])
    df[LAW_PRED] = entropy_law_pred(p, df[TOK.entropy], df["eps"])
    return df


def law_fit(pred, measured) -> dict[str, float]:
    """Pearson r, Spearman rho (Pearson of the ranks, ties averaged), the least-squares slope of measured on
    predicted and the share of tokens whose measured change has the predicted sign (zeros left out); NaN
    where undefined (fewer than 3 tokens, a constant side)."""
    x, y = np.asarray(pred, dtype=float), np.asarray(measured, dtype=float)  # [N], [N]
    out = dict.fromkeys(FIT_COLUMNS, np.nan) | {"n": float(len(x))}
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return out
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()  # [N], [N]
    nonzero = (x != 0) & (y != 0)  # [N]
    out.update(
        pearson=float(np.corrcoef(x, y)[0, 1]),
        spearman=float(np.corrcoef(rx, ry)[0, 1]),
        slope=float(np.polyfit(x, y, 1)[0]),
        sign_agree=float((np.sign(x[nonzero]) == np.sign(y[nonzero])).mean()) if nonzero.any() else np.nan,
    )
    return out


def entropy_law_fit(df: pd.DataFrame, measured: str = TOK.dentropy, pred: str = LAW_PRED) -> pd.DataFrame:
    """law_fit per step and pooled over the frame's steps (step = -1, the last row) of entropy_law rows:
    `pred` against `measured` (pred="dentropy_pred" gives the exact first-order reference)."""
    if df.empty:
        return pd.DataFrame(columns=[TOK.step, *FIT_COLUMNS])
    rows = [{TOK.step: int(s), **law_fit(g[pred], g[measured])} for s, g in df.groupby(TOK.step)]
    rows.append({TOK.step: -1, **law_fit(df[pred], df[measured])})
    return pd.DataFrame(rows)
