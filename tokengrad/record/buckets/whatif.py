"""What-if updates of one step: for each requested weighting rule, the gradient it would have produced from
the same parameters on the same tracked passes, without touching `.grad` or the optimizer.

A rule R's coefficients c^R_t = dL_R/dlog pi_t come from the recorded values alone
(tokengrad.objective.counterfactual); the chain rule then gives its gradient from the pass's retained graph,

    g_R = sum_t c^R_t grad log pi_t = sum_B g_{R,B},     g_{R,B} = grad sum_{t in B} c^R_t log pi_t,

with the bucket machinery of the probability-bucket analysis (bucket_analysis.bucket_gradients, AR-Lopti
arXiv 2505.12929 Fig. 1): one backward per probability bucket holding a token of non-zero c^R (or one
backward per rule with `WhatIf(buckets=False)`), summed into g_R; the buckets partition the loss tokens, so
no residual is left. Micro-batches of one update are weighted by their aggregation's normaliser
(counterfactual.pass_weight), as the trainer weights them. When the update's actual gradient g is read
(before clipping), each rule gets one `whatif` row with bucket 'all' (|g_R|, <g_R, g>/|g|^2, cos(g_R, g),
whether the host's clip would have cut it) and one row per bucket (its share <g_{R,B}, g_R>/|g_R|^2 of the
counterfactual update). A rule with phases (Lopti) gives one row set per phase, all at the same parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tokengrad import schema
from tokengrad.objective import counterfactual as cf
from tokengrad.objective.rule_spec import parse_rules, rule_label
from tokengrad.objective.weighting import WEIGHTINGS, rule_params
from tokengrad.record.buckets import analysis as bk
from tokengrad.record.checks import every_steps

ALL = schema.WHATIF_ALL  # bucket label of the whole counterfactual update


@dataclass(frozen=True)
class WhatIf:
    """What-if updates (the `whatif` table): every `every` steps (0 = never), for each of `rules` (names of
    the weighting registry, `"tr_grpo:alpha=0.5"` or `{"name": "tr_grpo", "alpha": 0.5}`), the gradient
    the rule would have produced from the same parameters on the same passes. `buckets`: also its share per
    probability bucket (the recorder's bucket edges; one backward per bucket with tokens, per rule, instead
    of one per rule). `loss`: the host loss's settings the rules are evaluated with (eps_low, eps_high,
    beta, aggregation, max_len, clip_ratio_c; tokengrad.objective.counterfactual.LOSS_KEYS);
    `max_grad_norm`: the host's clip, for `would_clip` (None: not recorded). Passes need `old_logprobs`
    and `advantages` (and `ref_logprobs` with beta > 0)."""

    rules: tuple = ()
    every: int = 0
    buckets: bool = True
    loss: dict | None = None
    max_grad_norm: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "every", every_steps("whatif.every", self.every))
        rules = parse_rules(self.rules, known=WEIGHTINGS, defaults=rule_params)
        object.__setattr__(self, "rules", tuple(rules))
        object.__setattr__(self, "loss", cf.loss_settings(self.loss))
        if not isinstance(self.buckets, bool):
            raise ValueError(f"whatif.buckets must be True or False, got {self.buckets!r}")
        clip = self.max_grad_norm
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, int | float) or clip <= 0):
            raise ValueError(f"whatif.max_grad_norm must be a number > 0 or None, got {clip!r}")
        if self.every and not self.rules:
            raise ValueError("WhatIf(every=N) needs rules=[...]: the weighting rules to evaluate")

    def labels(self) -> list[str]:
        return [rule_label(n, p) for n, p in self.rules]

    def with_host(self, *, loss: dict | None = None, max_grad_norm: float | None = None) -> "WhatIf":
        """This option with a host's loss settings and clip filled in where it gives none (the built-in
        trainer and the integrations know their loss; settings given here win)."""
        given = {k: v for k, v in (self.loss or {}).items() if v != cf.LOSS_KEYS[k]}
        return WhatIf(
            rules=[{"name": n, **p} for n, p in self.rules],
            every=self.every,
            buckets=self.buckets,
            loss={**(loss or {}), **given},
            max_grad_norm=self.max_grad_norm if self.max_grad_norm is not None else max_grad_norm,
        )


def as_whatif(value) -> WhatIf:
    """WhatIf(...) as given; None -> off. A rule name or list alone is refused: it needs `every`."""
    if value is None:
        return WhatIf()
    if not isinstance(value, WhatIf):
        raise ValueError(f"whatif must be WhatIf(rules=[...], every=N), got {type(value).__name__} {value!r}")
    return value


@dataclass
class _Sum:
    """One rule phase of one update: the per-bucket gradients sum_p w_p g_{R,B,p}, the pass weights."""

    grads: list  # per bucket: per-parameter gradients, or None
    n_tokens: list[int]
    weight: float = 0.0


@dataclass
class _Update:
    sums: dict = field(default_factory=dict)  # (label, phase) -> _Sum


class StepWhatIf:
    """What-if state of one step: `analyze` after each backward of tracked passes, `finish_update` when an
    update's gradient is read, `rows` the step's `whatif` rows. `options`: a `WhatIf`."""

    def __init__(self, options, edges: tuple, step: int, rank: int):
        self.options, self.edges, self.step, self.rank = options, edges, step, rank
        self.n_buckets = len(edges) - 1 if options.buckets else 1
        self.state: dict[int, _Update] = {}
        self.rows: list[dict] = []
        self._done: set[int] = set()  # pass ids analysed
        self._skipped: set[int] = set()  # updates begun in an earlier step: their passes are not all here

    def skip_update(self, update_id: int) -> None:
        """No rows for an update whose first passes ran in an earlier step (TRL accumulating over steps)."""
        self._skipped.add(update_id)

    def analyze(self, passes, named_params, *, keep_graph: bool) -> None:
        """The rules' per-bucket gradients of the passes not analysed yet (their graphs must exist); the
        last backward frees the graph unless `keep_graph` (the bucket analysis follows)."""
        params = [p for _, p in named_params]
        todo = [p for p in passes if p.pass_id not in self._done and p.logprobs.grad_fn is not None]
        self._done.update(p.pass_id for p in passes)
        jobs = [(p, job) for p in todo if p.update_id not in self._skipped for job in self._coefs(p)]
        for i, (p, (key, coef, phase, weight)) in enumerate(jobs):
            idx = self._bucket(p)  # [N, T]
            grads = bk.bucket_gradients(
                p.logprobs,
                coef * weight,
                in_loss=p.in_loss,
                bucket=idx,
                n_buckets=self.n_buckets,
                params=params,
                keep_graph=keep_graph or i < len(jobs) - 1,
            )
            s = self.state.setdefault(p.update_id, _Update()).sums.setdefault(
                key, _Sum([None] * self.n_buckets, [0] * self.n_buckets)
            )
            bk.accumulate(s.grads, grads)
            s.weight += weight
            for b in range(self.n_buckets):
                s.n_tokens[b] += int(((idx == b) & phase).sum())

    def _bucket(self, p) -> torch.Tensor:
        """[N, T] bucket of each token by its probability, as the buckets table (all 0 without buckets)."""
        if not self.options.buckets:
            return torch.zeros_like(p.in_loss, dtype=torch.long)
        return bk.bucket_index(p.tensors["prob"], self.edges)

    def _coefs(self, p) -> list[tuple]:
        """[((label, phase), c^R [N, T], the phase's loss tokens [N, T], pass weight)] of every rule and
        phase on pass `p`."""
        missing = [k for k in ("old_logprob", "advantage") if k not in p.tensors]
        if missing:
            names = {"old_logprob": "old_logprobs", "advantage": "advantages"}
            raise ValueError(
                f"WhatIf needs {' and '.join(names[k] for k in missing)} in st.track to evaluate other "
                f"weighting rules; pass {p.pass_id} of step {self.step} has none"
            )
        loss, t = self.options.loss, p.tensors
        if loss["beta"] != 0.0 and "ref_logprob" not in t:
            raise ValueError(f"WhatIf loss beta={loss['beta']} needs ref_logprobs in st.track")
        mask = p.in_loss.to(t["logprob"].dtype)  # [N, T]
        weight = cf.pass_weight(loss["aggregation"], mask)
        out = []
        for name, params in self.options.rules:
            coefs = cf.rule_coefs(
                t["logprob"],
                t["old_logprob"],
                t["advantage"],
                mask,
                rule=name,
                params=params,
                loss=loss,
                ref_logprobs=t.get("ref_logprob"),
                is_weight=t.get("is_weight"),
            )
            label = rule_label(name, params)
            out += [((label, k), c, phase, weight) for k, (c, phase) in enumerate(coefs)]
        return out

    def finish_update(self, update_id: int, total: list[torch.Tensor]) -> None:
        """The update's `whatif` rows against its actual gradient `total` (per parameter, before clipping)."""
        upd = self.state.pop(update_id, None)
        if upd is None:
            return
        for (label, phase), s in upd.sums.items():
            _all_reduce(s, total)
            key = dict(step=self.step, rank=self.rank, update_id=update_id, rule=label, phase=phase)
            self.rows += self._rows(s, total, key)

    def _rows(self, s: _Sum, total: list[torch.Tensor], key: dict) -> list[dict]:
        """The 'all' row and the bucket rows of one rule phase, from one Gram matrix of its bucket
        gradients, g_R and the actual g."""
        scale = 1.0 / s.weight if s.weight > 0 else 0.0
        grads = [None if g is None else [t * scale for t in g] for g in s.grads]
        have = [b for b, g in enumerate(grads) if g is not None]
        g_r = [sum(grads[b][i] for b in have) for i in range(len(total))] if have else None
        G, _ = bk.products([grads[b] for b in have] + [g_r], total) if have else (None, None)
        k = len(have)
        sq_r, dot_r, sq_g = (
            (float(G[k, k]), float(G[k, k + 1]), float(G[k + 1, k + 1])) if have else (0, 0, 0)
        )
        norm_r, norm_g = math.sqrt(max(sq_r, 0.0)), math.sqrt(max(sq_g, 0.0))
        clip = self.options.max_grad_norm
        rows = [
            dict(
                key,
                bucket=ALL,
                n_tokens=sum(s.n_tokens),
                grad_norm=norm_r,
                update_share=dot_r / sq_g if sq_g > 0 else math.nan,
                cos_to_actual=dot_r / (norm_r * norm_g) if norm_r > 0 and norm_g > 0 else math.nan,
                would_clip=None if clip is None else bool(norm_r > clip),
            )
        ]
        if not self.options.buckets:
            return rows
        pos = {b: j for j, b in enumerate(have)}
        for b, (lo, hi) in enumerate(zip(self.edges, self.edges[1:])):
            j = pos.get(b)
            nb = math.sqrt(max(float(G[j, j]), 0.0)) if j is not None else 0.0
            share = (float(G[j, k]) / sq_r if j is not None else 0.0) if sq_r > 0 else math.nan
            cos = float(G[j, k + 1]) / (nb * norm_g) if j is not None and nb > 0 and norm_g > 0 else math.nan
            rows.append(
                dict(
                    key,
                    bucket=schema.bucket_label(lo, hi),
                    lo=lo,
                    hi=hi,
                    n_tokens=s.n_tokens[b],
                    grad_norm=nb,
                    update_share=share,
                    cos_to_actual=cos,
                )
            )
        return rows


def _all_reduce(s: _Sum, like: list[torch.Tensor]) -> None:
    """Under several processes: the weighted gradients and the weights summed over ranks, so that the
    counterfactual is the global batch's (every rank joins every bucket, an empty one with zeros)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for b, g in enumerate(s.grads):
        if g is None:
            g = s.grads[b] = [torch.zeros_like(t) for t in like]
        for t in g:
            dist.all_reduce(t)
    device = like[0].device if like else "cpu"
    counts = torch.tensor([s.weight, *s.n_tokens], dtype=torch.float64, device=device)
    dist.all_reduce(counts)
    s.weight, s.n_tokens = float(counts[0]), [int(c) for c in counts[1:].tolist()]
