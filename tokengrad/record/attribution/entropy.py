"""Which tokens moved the entropy: each token's share of the first-order change of the update batch's mean
token entropy, and that change predicted and measured along the update actually applied.

With H_t(theta) the entropy of the next-token distribution at loss position t and M the update's loss
tokens (all passes and ranks), the mean entropy is H = (1/M) sum_t H_t. The loss reaches theta through the
log-probs, g = sum_t coef_t grad log pi_t (+ a residual from terms not built on log pi), so

    <grad H, g> = sum_t coef_t <grad log pi_t, grad H> + <grad H, residual>,
    entropy_share_t = coef_t <grad log pi_t, grad H> / <grad H, g>,   sum_t entropy_share_t + residual = 1

(the update_share identity of record/attribution/shares.py with grad H in place of g). A gradient step -eta g
changes H by -eta <grad H, g> to first order; entropy_share says which tokens' gradients that change is
made of. Cost per update: one backward of H (a forward with graph per pass and its backward into one
parameter-sized buffer, freed after the update's shares) and one directional pass of log pi along grad H
per pass.

The directional pass along the applied update delta that dlogprob_pred already runs carries the entropy
along: `recompute()` returns (log pi [N, T], H [N, T]) and the pair travels as one [2N, T] tensor, giving
dentropy_pred_t = <grad H_t, delta> and from its primal, at the updated parameters, the measured
dentropy_t = H_t(theta + delta) - H_t(theta) (H_t(theta) from the forwards of the backward of H).

Per update we also keep the batch covariance Cov(log pi, A) over the loss tokens (means over the update's
tokens, as Clip-Cov / KL-Cov, arXiv 2505.22617, and CW-GRPO, arXiv 2605.11538, compute it): for a tabular
softmax policy the first-order entropy change is -Cov_{a~pi}(log pi(a), delta z_a), which is
-eta Cov(log pi, A) under natural policy gradient (arXiv 2505.22617; tests/record/test_entropy_attribution.py
checks it, and the vanilla form -eta Cov(log pi, pi A)).

Under DDP the gradient g is the rank average, so a rank's shares are divided by the world size W (as
update_share's); grad H, M and every sum below are all-reduced, so each rank records the global values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tokengrad.record.attribution.shares import Recompute, directional_logprobs


# ---- the (log pi, H) pair through the [N, T] directional pass ------------------------------------------
def packed(recompute: Recompute, pass_id: int) -> Recompute:
    """() -> [2N, T]: the log-prob rows then the entropy rows of `recompute()`'s pair."""

    def fn() -> torch.Tensor:
        lp, ent = scores(recompute(), pass_id)
        return torch.cat([lp, ent.to(lp.dtype)], 0)  # [2N, T]

    return fn


def unpacked(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, T] log pi part, [N, T] entropy part) of a packed [2N, T] output."""
    n = out.shape[0] // 2
    return out[:n], out[n:]


def logprobs_only(recompute: Recompute) -> Recompute:
    """() -> [N, T] log pi, whether `recompute()` returns log pi alone or the (log pi, H) pair."""

    def fn() -> torch.Tensor:
        out = recompute()
        return out[0] if isinstance(out, (tuple, list)) else out

    return fn


def scores(out, pass_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi [N, T], H [N, T]) from what recompute() returned; a clear error when it is not that pair."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ValueError(
            f"Attribution(entropy=True): recompute() of pass {pass_id} must return the pair (log-probs "
            f"[N, T], entropy [N, T]), got {type(out).__name__}"
        )
    lp, ent = out
    if not (torch.is_tensor(lp) and torch.is_tensor(ent)) or lp.dim() != 2 or lp.shape != ent.shape:
        raise ValueError(
            f"recompute() of pass {pass_id} returned log-probs {tuple(getattr(lp, 'shape', ()))} and entropy "
            f"{tuple(getattr(ent, 'shape', ()))}; both must be [N, T] of the tracked pass"
        )
    return lp, ent


def token_entropy_shares(coef: torch.Tensor, along_h: torch.Tensor, h_dot_g: float) -> torch.Tensor:
    """coef_t <grad log pi_t, grad H> / <grad H, g> ([N, T]); NaN when <grad H, g> is 0 or not finite."""
    if h_dot_g == 0.0 or not math.isfinite(h_dot_g):
        return torch.full_like(along_h, math.nan)
    return torch.nan_to_num(coef.float()) * along_h.float() / h_dot_g  # [N, T]


def masked_sums(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """[sum, count] of the finite entries of x where m, float64 (for an all-reduce)."""
    ok = m & torch.isfinite(x)
    return torch.stack([torch.where(ok, x.double(), 0.0).sum(), ok.sum().double()])


def covariance_sums(lp: torch.Tensor, adv: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """[sum lp, sum A, sum lp A, count] over the loss tokens m ([N, T] each), float64."""
    x, y = torch.where(m, lp.double(), 0.0), torch.where(m, adv.double(), 0.0)
    return torch.stack([x.sum(), y.sum(), (x * y).sum(), m.sum().double()])


def covariance(sums: torch.Tensor) -> float:
    """Cov(log pi, A) = E[lp A] - E[lp] E[A] over the tokens the sums were taken on (arXiv 2505.22617)."""
    s_lp, s_a, s_lpa, n = sums.tolist()
    return s_lpa / n - (s_lp / n) * (s_a / n) if n > 0 else math.nan


def _all_sum(t: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        torch.distributed.all_reduce(t)
    return t


@dataclass
class _Update:
    """Per-update sums: loss tokens M, <grad H, g>, the shares' sum, Cov sums, predicted/measured sums."""

    n_tokens: float = 0.0
    h_dot_g: float = math.nan
    share_sum: float = math.nan
    cov: float = math.nan
    change: list = field(default_factory=lambda: [math.nan, math.nan])  # [sum pred, sum measured]


class EntropyAttribution:
    """The entropy half of one step's attribution (record/attribution/step.py calls it for every pass)."""

    def __init__(self, model: torch.nn.Module, method: str, eps: float | None, world: int):
        self.model, self.method, self.eps, self.world = model, method, eps, world
        self.updates: dict[int, _Update] = {}

    # ---- along g (before the optimizer step) -----------------------------------------------------------
    def recompute_of(self, p) -> Recompute:
        """The pass along delta: log pi and H rows packed into one [2N, T] output."""
        return packed(p.recompute, p.pass_id)

    def on_gradient(self, passes: list, named: list, update_id: int) -> None:
        """entropy_share of every pass of the update, from one backward of H and one JVP along grad H.
        Every rank calls it (also one without passes): the sums are all-reduced."""
        params = [p for _, p in named]
        dev = params[0].device if params else torch.device("cpu")
        u = self.updates.setdefault(update_id, _Update())
        cov = torch.zeros(5, dtype=torch.float64, device=dev)  # [Cov sums (4) | loss tokens M]
        for p in passes:
            cov[4] += p.in_loss.sum().to(dev)
            if "advantage" in p.tensors:
                cov[:4] += covariance_sums(p.tensors["logprob"], p.tensors["advantage"], p.in_loss).to(dev)
        _all_sum(cov, self.world)
        u.cov, u.n_tokens = covariance(cov[:4]), float(cov[4])
        grad_h = self._grad_mean_entropy(passes, params, u.n_tokens)  # list [P] like params
        grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
        u.h_dot_g = float(
            sum(torch.dot(a.flatten().double(), b.flatten().double()) for a, b in zip(grad_h, grads))
        )
        tangents = {n: t for (n, _), t in zip(named, grad_h)}
        total = torch.zeros(2, dtype=torch.float64, device=dev)
        for p in passes:
            if p.coef is None:
                continue
            _, along_h = directional_logprobs(
                self.model, logprobs_only(p.recompute), tangents, self.method, self.eps
            )
            share = token_entropy_shares(p.coef, along_h, u.h_dot_g) / self.world  # [N, T]
            p.tensors["entropy_share"] = share
            total += masked_sums(share, p.mask).to(dev)
        _all_sum(total, self.world)
        u.share_sum = float(total[0]) if total[1] > 0 else math.nan

    def _grad_mean_entropy(self, passes: list, params: list, n_tokens: float) -> list[torch.Tensor]:
        """grad_theta H = (1/M) sum over loss tokens of grad H_t, one backward per pass, into one buffer
        (all-reduced under DDP). Nothing touches .grad. The forwards also give H_t before the update,
        the baseline of the measured dentropy."""
        out = [torch.zeros_like(q) for q in params]
        for p in passes:
            with torch.enable_grad():
                _, ent = scores(p.recompute(), p.pass_id)  # [N, T] with graph
                p.tensors["_entropy_before"] = ent.detach().float()  # '_': not a token column
                if not bool(p.in_loss.any()):
                    continue
                h = torch.where(p.in_loss, ent.float(), 0.0).sum() / max(n_tokens, 1.0)
                got = torch.autograd.grad(h, params, allow_unused=True)
            torch._foreach_add_(
                out, [g if g is not None else torch.zeros_like(q) for g, q in zip(got, params)]
            )
        if self.world > 1:
            for t in out:
                torch.distributed.all_reduce(t)
        return out

    # ---- along the applied update ----------------------------------------------------------------------
    def after(self, passes: list, outputs: list, update_id: int) -> None:
        """dentropy_pred and dentropy of the update's passes from their packed passes along delta
        (`outputs`: (now [2N, T], pred [2N, T]) per pass); the update's sums, all-reduced."""
        dev = passes[0].mask.device if passes else torch.device("cpu")
        sums = torch.zeros(4, dtype=torch.float64, device=dev)  # [sum pred, n, sum measured, n]
        for p, (now, pred) in zip(passes, outputs):
            ent_now, ent_pred = unpacked(now)[1], unpacked(pred)[1]
            p.tensors["dentropy_pred"] = ent_pred  # [N, T]
            before = p.tensors.pop("_entropy_before", None)  # None: no gradient pass for this update
            p.tensors["dentropy"] = (
                ent_now - before if before is not None else torch.full_like(ent_now, math.nan)
            )
            sums[:2] += masked_sums(ent_pred, p.in_loss).to(dev)
            sums[2:] += masked_sums(p.tensors["dentropy"], p.in_loss).to(dev)
        _all_sum(sums, self.world)
        u = self.updates.setdefault(update_id, _Update())
        u.change = [float(sums[0]), float(sums[2])] if sums[1] > 0 else [math.nan, math.nan]

    # ---- per step --------------------------------------------------------------------------------------
    def step_scalars(self) -> dict[str, float]:
        """The steps-table values: means over the step's attributed updates weighted by their loss tokens
        (for a step of one update, that update's values), and the mean residual of the shares."""
        ups = [u for u in self.updates.values() if u.n_tokens > 0]
        if not ups:
            return {}
        m = sum(u.n_tokens for u in ups)

        def mean(vals) -> float:
            return float(sum(u.n_tokens * v for u, v in zip(ups, vals)) / m)

        resid = [1.0 - u.share_sum for u in ups]
        out = {
            "dentropy_mean_pred": sum(u.change[0] for u in ups) / m,
            "dentropy_mean": sum(u.change[1] for u in ups) / m,
            "entropy_grad_dot": mean([u.h_dot_g for u in ups]),
            "entropy_share_residual": sum(resid) / len(resid),
            "cov_logprob_adv": mean([u.cov for u in ups]),
        }
        return {k: v for k, v in out.items() if math.isfinite(v)}  # undefined values stay null
