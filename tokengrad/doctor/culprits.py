"""The tokens behind a step's gradient: exact shares of the update where the step was attributed
(`update_share`, attribution steps), else an estimate from the tokens' logit-gradient norms.

    culprits(view, step=142, k=20)        # TokenEvidence, largest share first
    summarize(tokens)                     # "3 tokens of sample 17, p ~ 0.002, made 71 % of step 142's update"
"""

from __future__ import annotations

import numpy as np

from tokengrad.doctor.finding import TokenEvidence
from tokengrad.doctor.registry import pct
from tokengrad.doctor.view import RunView

_COLS = "sample_id, position, token_id, token, prob"


def culprits(view: RunView, step: int, k: int = 20) -> tuple[TokenEvidence, ...]:
    """The k loss tokens of `step` with the largest share: `update_share` (exact; sums to 1 with the
    residual over all tokens) when recorded, else logit_grad_norm / its sum over the step (an estimate:
    it ignores how the tokens' gradients align)."""
    if not view.has_tokens:
        return ()
    cols = view.token_columns()
    exact = False
    if "update_share" in cols:
        n = view.sql("SELECT count(update_share) AS n FROM tokens WHERE step = ? AND in_loss", [step])["n"]
        exact = bool(n.iloc[0]) if len(n) else False
    if exact:
        q = (
            f"SELECT {_COLS}, update_share AS share FROM tokens WHERE step = ? AND in_loss "
            "AND update_share IS NOT NULL "
            f"ORDER BY abs(update_share) DESC, sample_id, position LIMIT {int(k)}"
        )
    elif "logit_grad_norm" in cols:
        q = (
            f"SELECT {_COLS}, logit_grad_norm / sum(logit_grad_norm) OVER () AS share FROM tokens "
            f"WHERE step = ? AND in_loss AND logit_grad_norm IS NOT NULL "
            f"ORDER BY logit_grad_norm DESC, sample_id, position LIMIT {int(k)}"
        )
    else:
        return ()
    df = view.sql(q, [int(step)])
    return tuple(
        TokenEvidence(
            step=int(step),
            sample_id=int(r.sample_id),
            position=int(r.position),
            token_id=int(r.token_id),
            text=str(r.token) if r.token is not None else "",
            share=float(r.share) if np.isfinite(r.share) else None,
            share_of="update" if exact else "logit_grad_norm",
            exact=exact,
            prob=float(r.prob) if r.prob is not None and np.isfinite(r.prob) else None,
            rank=i,
        )
        for i, r in enumerate(df.itertuples())
    )


def summarize(tokens: tuple[TokenEvidence, ...], most: int = 5) -> str:
    """One clause naming the sample whose tokens carry the most of the listed share, with its top tokens."""
    if not tokens:
        return ""
    by_sample: dict[int, list[TokenEvidence]] = {}
    for t in tokens:
        by_sample.setdefault(t.sample_id, []).append(t)
    sample, toks = max(by_sample.items(), key=lambda kv: (sum(t.share or 0 for t in kv[1]), -kv[0]))
    # the fewest of its tokens that hold 90 % of its listed share (at most `most`)
    cum = np.cumsum([t.share or 0 for t in toks])
    n = int(np.searchsorted(cum, 0.9 * cum[-1]) + 1) if cum[-1] > 0 else 1
    toks = toks[: min(n, most)]
    share = sum(t.share or 0 for t in toks)
    probs = [t.prob for t in toks if t.prob is not None]
    p = f", p ~ {np.median(probs):.2g}" if probs else ""
    what = "update" if toks[0].exact else "summed logit-gradient norm (estimate)"
    texts = " ".join(repr(t.text) for t in toks[:3])
    n = len(toks)
    return f"{n} token{'s' if n > 1 else ''} of sample {sample} ({texts}{p}) made {pct(share)} of the {what}"
