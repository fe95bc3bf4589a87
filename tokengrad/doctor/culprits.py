"""The tokens behind a step's gradient: exact shares of the update where the step was attributed
(`update_share`, attribution steps), else an estimate from the tokens' logit-gradient norms.

    culprits(view, step=142, k=20)        # TokenEvidence, largest share first
    lead_first(tokens)                    # the sample the headline names first: headline, list, link agree
    summarize(tokens)                     # "3 tokens of sample 17, p ~ 0.002, made 71 % of step 142's update"
"""

from __future__ import annotations

import numpy as np

from tokengrad.doctor.finding import TokenEvidence
from tokengrad.doctor.registry import pct
from tokengrad.doctor.view import RunView
from tokengrad.read.evidence_text import evidence_texts
from tokengrad.read.token_shares import token_shares
from tokengrad.schema import TOK


def culprits(view: RunView, step: int, k: int = 20) -> tuple[TokenEvidence, ...]:
    """The k loss tokens of `step` with the largest share of the step's combined update
    (tokengrad.read.token_shares.token_shares, the token inspector's default share): by `update_share`
    (exact) when the step recorded it, else by logit_grad_norm over its sum (an estimate: it ignores how
    the tokens' gradients align). A token holding part of a character split over tokens reads as the
    whole character, marked (tokengrad.read.evidence_text); token_id stays the recorded id."""
    if not view.has_tokens:
        return ()
    exact = False
    if view.has_token_columns(TOK.update_share):
        n = view.sql(
            f"SELECT count({TOK.update_share}) AS n FROM tokens WHERE {TOK.step} = ? AND {TOK.in_loss}",
            [step],
        )["n"]
        exact = bool(n.iloc[0]) if len(n) else False
    if not exact and not view.has_token_columns(TOK.logit_grad_norm):
        return ()
    value = TOK.update_share if exact else TOK.logit_grad_norm
    df = token_shares(view, int(step), value=value, k=int(k))
    # a token holding part of a split character names the whole character (the id stays as recorded)
    texts = evidence_texts(view, int(step), zip(df[TOK.sample_id], df[TOK.position]))
    return tuple(
        TokenEvidence(
            step=int(step),
            sample_id=int(r.sample_id),
            position=int(r.position),
            token_id=int(r.token_id),
            text=texts.get((int(r.sample_id), int(r.position)), ""),
            share=float(r.share) if r.share is not None and np.isfinite(r.share) else None,
            share_of="update" if exact else TOK.logit_grad_norm,
            exact=exact,
            prob=float(r.prob) if r.prob is not None and np.isfinite(r.prob) else None,
            rank=i,
        )
        for i, r in enumerate(df.itertuples())
    )


def lead_sample(tokens: tuple[TokenEvidence, ...]) -> int | None:
    """The sample whose listed tokens carry the most of the listed share (ties: the lower id)."""
    by_sample: dict[int, float] = {}
    for t in tokens:
        by_sample[t.sample_id] = by_sample.get(t.sample_id, 0.0) + (t.share or 0.0)
    return max(by_sample, key=lambda s: (by_sample[s], -s)) if by_sample else None


def lead_first(tokens: tuple[TokenEvidence, ...]) -> tuple[TokenEvidence, ...]:
    """The lead sample's tokens first, then the others, each in rank order: a finding's headline
    (summarize), its token list and its link (tokengrad.doctor.links: the first token's sample) then name
    the same sample."""
    lead = lead_sample(tokens)
    return tuple(sorted(tokens, key=lambda t: (t.sample_id != lead, t.rank)))


def summarize(tokens: tuple[TokenEvidence, ...], most: int = 5) -> str:
    """One clause naming the lead sample (lead_sample), with its top tokens."""
    if not tokens:
        return ""
    sample = lead_sample(tokens)
    toks = sorted((t for t in tokens if t.sample_id == sample), key=lambda t: t.rank)
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
