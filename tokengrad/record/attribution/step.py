"""Attribution on one recorded step: each tracked token's share of the update it fed, and the applied
update's predicted and measured change of its log pi.

Order of events for update u (the trainer and the TRL attach both follow it):

    backward passes of u            -> coef_t by the recorder's hook, g accumulated in .grad
    st.record_grad_norms(u)         -> on_gradient: one directional pass along g per tracked pass of u
                                       (update_share), then a copy of theta (the pending update)
    opt.step()                      -> theta + delta
    record_grad_norms(u + 1) / end  -> after_update: delta = theta_now - copy (in place, same buffer), one
                                       directional pass along delta at theta_now per pass of u:
                                       dlogprob_pred = <grad log pi_t, delta>, dlogprob = log pi_now - log pi

The prediction is the first-order Taylor term at the updated parameters, so it differs from the measured
change by the second-order term (1/2) delta^T H delta (H the Hessian of log pi_t); its primal output is the
after-update forward that measures the change, so both come from the same pass. Extra memory: one
parameter-sized buffer, and only when the applied update is attributed.

Under DDP every rank holds the averaged gradient g = (1/W) sum_ranks sum_t coef_t grad log pi_t, so each
rank's shares are divided by W and the shares of all ranks sum to 1 - residual. FSDP averages the same way;
with sharded gradients the directional passes are central differences at perturbed shards
(record/attribution/shard_difference.py), and the snapshot of theta is this rank's shard.
"""

from __future__ import annotations

import math
import warnings

import torch

from tokengrad import schema
from tokengrad.record.attribution.entropy import EntropyAttribution, logprobs_only, unpacked
from tokengrad.record.attribution.shard_difference import shard_difference_logprobs  # noqa: F401 (registers it)
from tokengrad.record.attribution.shares import ATTRIBUTION_METHODS, directional_logprobs, token_update_shares
from tokengrad.record.buckets import analysis as bk
from tokengrad.record.buckets.sharded import local_shard, refuse_sharding
from tokengrad.record.distributed import grads_are_sharded
from tokengrad.record.gradnorms import trainable_params

# |log pi recomputed - log pi tracked| above this: recompute() is not the tracked pass
CONSISTENCY_TOL = 1e-2


class StepAttribution:
    """Attribution of one step's updates. `model`: the recorder's model; `method`: a name of
    ATTRIBUTION_METHODS; `applied`: also attribute the applied update delta (one parameter copy);
    `entropy`: also the entropy columns (record/attribution/entropy.py; recompute() returns the pair)."""

    def __init__(
        self,
        model: torch.nn.Module,
        method: str = "jvp",
        eps: float | None = None,
        applied: bool = True,
        entropy: bool = False,
    ):
        ATTRIBUTION_METHODS[method]  # unknown name -> ValueError listing the known ones
        if grads_are_sharded(model):  # forward-mode AD cannot pass FSDP's all-gathers (shard_difference.py)
            if entropy:
                raise ValueError(
                    "tokengrad: entropy attribution is refused under sharded (FSDP) gradients (its entropy "
                    "backward would run outside the wrapper); update_share and dlogprob_pred stay exact: "
                    "set Attribution(entropy=False)"
                )
            refuse_sharding(model, attribution=1)  # a model wrapped after the recorder opened
            method = "shard_difference"
        self.model, self.method, self.eps, self.applied = model, method, eps, applied
        self.world = _world_size()
        self.entropy = EntropyAttribution(model, method, eps, self.world) if entropy else None
        self._before: list[torch.Tensor] | None = None  # theta before the pending update
        self._pending: int | None = None  # update_id whose applied delta is not yet attributed
        self._warned = False

    # ---- along the gradient -------------------------------------------------------------------------
    def on_gradient(self, passes: list, update_id: int, g_sq: float) -> None:
        """update_share of every pass of `update_id`, from the gradient now in .grad (before clipping)."""
        if self._pending is not None:
            self.after_update(passes)
        named = trainable_params(self.model)
        tangents = {n: p.grad for n, p in named if p.grad is not None}
        mine = self._passes_of(passes, update_id)
        for p in mine:
            if p.coef is None:
                continue
            primal, along_g = self._directional(p, tangents)
            p.tensors["update_share"] = token_update_shares(p.coef, along_g, g_sq) / self.world  # [N, T]
        if self.entropy is not None:  # one backward of the mean entropy, one pass along its gradient
            self.entropy.on_gradient(mine, named, update_id)
        if self.applied:
            self._snapshot([p for _, p in named])
            self._pending = update_id

    def _snapshot(self, params: list[torch.Tensor]) -> None:
        with torch.no_grad():
            if self._before is None or len(self._before) != len(params):
                self._before = [local_shard(p.detach()).clone() for p in params]  # this rank's shards
            else:
                torch._foreach_copy_(self._before, [local_shard(p.detach()) for p in params])

    # ---- along the applied update -------------------------------------------------------------------
    def after_update(self, passes: list) -> None:
        """dlogprob_pred and dlogprob of the pending update's passes, at the parameters now in the model."""
        if self._pending is None:
            return
        update_id, self._pending = self._pending, None
        named = trainable_params(self.model)
        with torch.no_grad():
            delta = self._before  # becomes theta_now - theta_before, in place
            torch._foreach_neg_(delta)
            torch._foreach_add_(delta, [local_shard(p.detach()) for _, p in named])
        tangents = {n: d for (n, _), d in zip(named, delta)}
        mine, outputs = self._passes_of(passes, update_id), []
        for p in mine:
            outputs.append(directional_logprobs(self.model, self._fn(p), tangents, self.method, self.eps))
            now, pred = self._logprob_part(outputs[-1])
            p.tensors["dlogprob_pred"] = pred  # [N, T]
            p.tensors["dlogprob"] = now - p.tensors["logprob"]  # [N, T]
        if self.entropy is not None:  # the entropy rows of the same passes: dentropy_pred, dentropy
            self.entropy.after(mine, outputs, update_id)

    def finish(self, passes: list) -> None:
        """Attribute a pending applied update (the parameters are now after it) and free the copy."""
        try:
            self.after_update(passes)
        finally:
            self._before = None

    # ---- helpers ------------------------------------------------------------------------------------
    def _passes_of(self, passes: list, update_id: int) -> list:
        mine = [p for p in passes if p.update_id == update_id]
        missing = [p.pass_id for p in mine if p.recompute is None]
        if missing and not self._warned:
            self._warned = True
            warnings.warn(
                f"tokengrad: attribution step, but passes {missing} were tracked without "
                f"recompute=...; their tokens get no update_share",
                RuntimeWarning,
                stacklevel=4,
            )
        return [p for p in mine if p.recompute is not None]

    def _fn(self, p):
        """What the pass along delta evaluates: log pi, or with entropy the packed (log pi, H) rows."""
        return logprobs_only(p.recompute) if self.entropy is None else self.entropy.recompute_of(p)

    def _logprob_part(self, out: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        if self.entropy is None:
            return out
        (lp, _), (d_lp, _) = unpacked(out[0]), unpacked(out[1])
        return lp, d_lp

    def scalars(self) -> dict[str, float]:
        """The step's entropy values for the steps table (none without entropy attribution)."""
        return self.entropy.step_scalars() if self.entropy is not None else {}

    def _directional(self, p, tangents: dict) -> tuple[torch.Tensor, torch.Tensor]:
        fn = logprobs_only(p.recompute)  # the entropy's own passes take H before the update
        primal, along = directional_logprobs(self.model, fn, tangents, self.method, self.eps)
        lp = p.tensors["logprob"]
        if primal.shape != lp.shape:
            raise ValueError(
                f"recompute() of pass {p.pass_id} returned shape {tuple(primal.shape)}, the "
                f"tracked logprobs have {tuple(lp.shape)}"
            )
        gap = float((primal - lp).abs()[p.mask].max()) if bool(p.mask.any()) else 0.0
        if not gap <= CONSISTENCY_TOL:
            warnings.warn(
                f"tokengrad: recompute() of pass {p.pass_id} differs from the tracked log-probs by "
                f"{gap:.3g} (dropout on? a different batch?); its update_share is not exact",
                RuntimeWarning,
                stacklevel=4,
            )
        return primal, along


def bucket_share_rows(
    passes: list, update_id: int, *, edges: tuple[float, ...], step: int, rank: int, device: torch.device
) -> list[dict]:
    """Bucket rows of one update from its tokens' shares: update_share_B = sum of update_share over B
    (exact: the shares are linear in the token set), n_tokens / token_share over loss tokens, and the
    residual 1 - sum_B. Summed over ranks under DDP (every rank must call it, also one without passes, as
    the exact bucket passes do); empty when no rank's passes have shares."""
    mine = [p for p in passes if p.update_id == update_id and "update_share" in p.tensors]
    nb = len(edges) - 1
    acc = torch.zeros(2 * nb + 1, dtype=torch.float64, device=device)  # [shares | counts | n passes]
    for p in mine:
        idx = bk.bucket_index(p.tensors["prob"], edges)  # [N, T]
        s = p.tensors["update_share"].double()  # [N, T]
        acc[:nb] += torch.bincount(idx[p.mask], weights=s[p.mask], minlength=nb)[:nb].to(device)
        acc[nb : 2 * nb] += torch.bincount(idx[p.in_loss], minlength=nb)[:nb].double().to(device)
        acc[-1] += 1
    if _world_size() > 1:
        torch.distributed.all_reduce(acc)
    if acc[-1] == 0:
        return []
    shares, counts = acc[:nb].tolist(), [int(c) for c in acc[nb : 2 * nb].tolist()]
    n_all = max(sum(counts), 1)
    rows = [
        dict(
            step=step,
            rank=rank,
            update_id=update_id,
            bucket=schema.bucket_label(lo, hi),
            lo=lo,
            hi=hi,
            n_tokens=counts[b],
            token_share=counts[b] / n_all,
            update_share=shares[b],
        )
        for b, (lo, hi) in enumerate(zip(edges, edges[1:]))
    ]
    total = sum(shares)
    rows.append(
        dict(
            step=step,
            rank=rank,
            update_id=update_id,
            bucket=schema.RESIDUAL_BUCKET,
            update_share=1.0 - total if math.isfinite(total) else math.nan,
        )
    )
    return rows


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
