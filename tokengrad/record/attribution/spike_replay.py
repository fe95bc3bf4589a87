"""The exact replay of a gradient spike (`Attribution(on_spike=True)`): which step to attribute although its
schedule does not say so, and the step's gradient norm without its top-k culprit tokens.

Watch. `SpikeWatch` keeps the pre-clip total gradient norms of the steps recorded so far; inside
`record_grad_norms`, before the optimizer step, an update whose norm has a modified z-score above 3.5
against them (the doctor's rule, tokengrad/doctor/spike_rule.py: Iglewicz & Hoaglin 1993) is a spike, and
its step is attributed then (record/attribution/step.py: each token's exact update_share).

Replay. The update's gradient is g = sum_t coef_t grad log pi_t + residual (attribution/shares.py; coef the
autograd value dL/dlog pi_t). With S_k the k loss tokens of largest |update_share| (the doctor's culprits,
in its order: |share| descending, then sample_id, position),

    g_{-S_k} = g - sum_{t in S_k} coef_t grad log pi_t,     grad_norm_without_top{k} = |g_{-S_k}|

the gradient the update would have had without those tokens' loss terms, every other token's coefficient
held (so it equals the plain backward of the loss with S_k masked out whenever that mask leaves the other
coefficients alone, e.g. a fixed normaliser such as Dr. GRPO's; a per-batch token mean would also rescale
the rest). The subtracted sums are backward passes through `recompute()` (one forward with graph per pass
that holds culprits, one torch.autograd.grad per nested interval S_k \\ S_k', so .grad, which the
optimizer still needs, is never touched), on the spike step only: one parameter-sized buffer and one
transient gradient on top of the step's memory.
"""

from __future__ import annotations

import math
import warnings
from collections import deque

import torch

from tokengrad.doctor.spike_rule import SPIKE_MIN_STEPS, is_spike, robust_z
from tokengrad.record.attribution.entropy import logprobs_only
from tokengrad.schema import REPLAY_K  # the columns grad_norm_without_top1 / top5 / top20

WATCH_WINDOW = 1000  # the reference: the last 1000 steps with a gradient (a bounded median per step)


def replay_column(k: int) -> str:
    return f"grad_norm_without_top{k}"


class SpikeWatch:
    """The pre-clip total norms of the steps so far (finite and > 0: steps with a gradient) and the rule."""

    def __init__(self, window: int = WATCH_WINDOW):
        self.norms: deque[float] = deque(maxlen=window)
        self.warned = False  # the one warning of a run whose spikes cannot be replayed

    def z(self, total: float) -> float:
        """The modified z-score of `total` against the steps seen so far (NaN before SPIKE_MIN_STEPS)."""
        if len(self.norms) < SPIKE_MIN_STEPS or not math.isfinite(total):
            return math.nan
        return float(robust_z([total], list(self.norms))[0])

    def flags(self, total: float) -> tuple[bool, float]:
        z = self.z(total)
        return is_spike(z), z

    def add(self, total: float | None) -> None:
        """One finished step's norm (the max over its updates) joins the reference."""
        if total is not None and math.isfinite(total) and total > 0:
            self.norms.append(float(total))


def top_tokens(passes: list, k: int) -> list[tuple[object, int, int]]:
    """The k loss tokens of `passes` with the largest |update_share| as (pass, row, position), in the
    doctor's order (|share| descending, then sample_id, position)."""
    cand = []
    for p in passes:
        share = p.tensors.get("update_share")
        if share is None or p.coef is None:
            continue
        m = p.in_loss & torch.isfinite(share)  # [N, T]
        if not bool(m.any()):
            continue
        vals = share[m].abs()  # [M]
        keep = torch.topk(vals, min(k, vals.numel())).indices
        where = m.nonzero()[keep].tolist()  # [k', 2] (row, position)
        for (n, t), v in zip(where, vals[keep].tolist()):
            cand.append((-v, int(p.sample_ids[n]), t, p.pass_id, p, n))
    cand.sort(key=lambda c: c[:4])
    return [(c[4], c[5], c[2]) for c in cand[:k]]


def norms_without(passes: list, named: list, ks=REPLAY_K) -> dict[int, float]:
    """{k: |g - sum_{t in S_k} coef_t grad log pi_t|} for the update whose passes are `passes` (their
    gradient g in the .grad of `named`, before clipping; shares and coef recorded). A k beyond the number of
    tokens with a share removes them all."""
    ks = sorted(set(int(k) for k in ks))
    top = top_tokens(passes, ks[-1])
    params = [p for _, p in named]
    with torch.no_grad():
        rest = [
            p.grad.detach().float().clone()
            if p.grad is not None
            else torch.zeros_like(p, dtype=torch.float32)
            for p in params
        ]  # becomes g_{-S_k}, interval by interval
    out, done = {}, 0
    for k in ks:
        upto = min(k, len(top))
        _subtract(top[done:upto], params, rest)
        done = upto
        norms = torch._foreach_norm(rest)
        out[k] = float(torch.stack(norms).double().pow(2).sum().sqrt())
    return out


def _subtract(tokens: list, params: list, rest: list) -> None:
    """rest -= sum over `tokens` of coef_t grad log pi_t: per pass, one recompute() forward with graph and
    one torch.autograd.grad (the parameters' .grad stay as they are)."""
    by_pass: dict[int, tuple[object, list]] = {}
    for p, n, t in tokens:
        by_pass.setdefault(p.pass_id, (p, []))[1].append((n, t))
    for p, where in by_pass.values():
        w = torch.zeros_like(p.coef, dtype=torch.float32)  # [N, T] coef on the removed tokens, 0 elsewhere
        rows, cols = (torch.tensor(x, device=w.device) for x in zip(*where))
        w[rows, cols] = torch.nan_to_num(p.coef.float()[rows, cols])
        with torch.enable_grad():
            lp = logprobs_only(p.recompute)()  # [N, T] log pi at the parameters g was taken at
            grads = torch.autograd.grad((w * lp.float()).sum(), params, allow_unused=True)
        with torch.no_grad():
            for r, g in zip(rest, grads):
                if g is not None:
                    r.sub_(g.float())


def replay_spike(passes: list, named: list, world: int, watch: SpikeWatch) -> dict[str, float]:
    """The replay columns of one spiking update, or {} where they cannot be exact (several processes: the
    culprits would have to be ranked over every rank's tokens), with one warning per run."""
    if world > 1:
        if not watch.warned:
            watch.warned = True
            warnings.warn(
                "tokengrad: Attribution(on_spike=True) attributes the spike step, but the replay without "
                "the top-k tokens needs one process (it ranks the culprits over the whole batch)",
                RuntimeWarning,
                stacklevel=4,
            )
        return {}
    return {replay_column(k): v for k, v in norms_without(passes, named).items()}
