"""One step of a recording: tracked passes, the coef hook, grad norms, buckets, scalars and samples.

A pass is one backward pass. A step may hold several (gradient-accumulation micro-batches, several
optimizer updates per rollout batch with num_iterations > 1 or PPO mini-batches, Lopti's two phases). Each
`track()` call is one pass (pass_id 0, 1, ...) and names the optimizer update it feeds (update_id); grad
norms and bucket figures are recorded per update_id and describe the gradient accumulated by all passes of
that update.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import pyarrow as pa
import torch

from tokengrad import schema
from tokengrad.record import bucket_analysis as bk
from tokengrad.record.bucket_rows import BucketState, bucket_rows
from tokengrad.record.budget import budgeted, capture_pass
from tokengrad.record.checks import RESERVED, check_ids, check_scalars, check_track_inputs
from tokengrad.record.distributed import global_grad_norms, grads_are_sharded
from tokengrad.record.gradnorms import grad_norms, trainable_params
from tokengrad.record.rows import CapturedBatch, sample_rows, scalar_table, step_derived, tokens_table
from tokengrad.record.stats import TokenStats, token_stats
from tokengrad.record.step_attribution import StepAttribution, bucket_share_rows
from tokengrad.record.writer import Rows

_NUMERIC_STEP_COLUMNS = {
    f.name
    for f in schema.arrow_schema("steps")
    if pa.types.is_floating(f.type) or pa.types.is_integer(f.type)
}


@dataclass
class _Pass:
    """A tracked pass while the step is open (tensors stay on their device until the step ends)."""

    pass_id: int
    update_id: int
    logprobs: torch.Tensor  # [N, T] with graph (dropped after the backward)
    tensors: dict[str, torch.Tensor]  # [N, T] detached values
    token_ids: torch.Tensor
    mask: torch.Tensor  # [N, T] bool
    in_loss: torch.Tensor  # [N, T] bool
    sample_ids: torch.Tensor  # [N]
    group_ids: torch.Tensor  # [N]
    scale: torch.Tensor | None
    clipped: torch.Tensor | None
    extra: dict[str, torch.Tensor]
    coef: torch.Tensor | None = None  # [N, T] filled by the hook
    handle: object = None
    bucketed: bool = False
    recompute: object = None  # () -> [N, T] log pi again, for attribution steps


class StepRecorder:
    def __init__(self, recorder, step: int, bucket_step: bool, attribute_step: bool = False):
        self.rec = recorder
        self.step = step
        self.is_bucket_step = bucket_step and recorder.model is not None
        self.attribution = (
            StepAttribution(
                recorder.model, recorder.attribute_method, recorder.attribute_eps, recorder.attribute_applied
            )
            if attribute_step and recorder.model is not None
            else None
        )
        self._passes: list[_Pass] = []
        self._scalars: dict = {}
        self._samples: list[dict] = []
        self._layer_rows: list[dict] = []
        self._bucket_rows: list[dict] = []
        self._bucket_state: dict[int, BucketState] = {}
        self._update_norms: dict[int, float] = {}
        self._t0 = time.perf_counter()
        self._t_record = 0.0
        self._in_bucket_backward = False

    def __enter__(self) -> "StepRecorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.rec.current_step is self:
            self.rec.end_step()

    # ---- passes ------------------------------------------------------------------------------------
    def track(
        self,
        logprobs: torch.Tensor,
        *,
        token_ids: torch.Tensor,
        mask: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        old_logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        rollout_logprobs: torch.Tensor | None = None,
        advantages: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
        scale_grad: torch.Tensor | None = None,
        sample_ids: torch.Tensor | None = None,
        group_ids: torch.Tensor | None = None,
        logits: torch.Tensor | None = None,
        stats: TokenStats | None = None,
        hidden: torch.Tensor | None = None,
        clipped: torch.Tensor | None = None,
        update_id: int = 0,
        extra: dict[str, torch.Tensor] | None = None,
        recompute=None,
    ) -> torch.Tensor:
        """Track one backward pass's per-token log-probs; the loss built from them must be backpropagated
        (`st.backward(loss)` or `loss.backward()`) before the next update's norms are recorded.

        Args:
            logprobs: [N, T] log pi_theta of the sampled tokens, with graph; an autograd hook on it reads
                the exact loss coefficient coef = dL/d log pi per token.
            token_ids: [N, T] the sampled token ids (decoded to `token_text`).
            mask: [N, T] 1 = a real completion token (recorded); default all ones.
            loss_mask: [N, T] 1 = the token is in this pass's loss (e.g. not a tool output, in Lopti's
                current phase); default `mask`.
            old_logprobs: [N, T] log pi_old of the rollout policy (ratio = exp(logprobs - old_logprobs)).
            ref_logprobs: [N, T] log pi_ref of the reference model (KL columns).
            rollout_logprobs: [N, T] log-prob under the distribution the sampler drew from (after top-p, in
                the generation dtype; NaN where there is none); column `rollout_logprob`.
            advantages: [N] or [N, T] advantages.
            weights: [N, T] the token weights of the weighting rule (column `weight`).
            scale_grad: [N, T] multiplies the gradient reaching `logprobs` (weighting through the hook,
                as the TRL integration does); the recorded coef includes it.
            sample_ids: [N] row id of each sequence in the step (unique over ranks); default 0..N-1.
            group_ids: [N] prompt group of each sequence; default the sample id.
            logits: [N, T, V] logits, to compute probability, entropy and sum p^2 (chunked pass);
                not needed when `stats` is given.
            stats: the `TokenStats` of `logprobs_with_stats`, instead of `logits`.
            hidden: [N, T, D] last hidden states feeding the LM head: per-token head gradient norm.
            clipped: [N, T] bool, the PPO clip removed the token's policy gradient.
            update_id: the optimizer update (within the step) this pass's gradient feeds.
            extra: name -> [N, T] tensors stored as extra token columns (names must not collide with
                the schema's columns).
            recompute: () -> [N, T] these log-probs again (same batch, no dropout), run by attribution
                steps (`Recorder(attribute_every=...)`) with substituted parameters; ignored otherwise.

        Returns:
            `logprobs` itself (so `lp = st.track(lp, ...)` reads naturally).
        """
        t = time.perf_counter()
        N, T = check_track_inputs(
            logprobs,
            token_ids=token_ids,
            mask=mask,
            loss_mask=loss_mask,
            old_logprobs=old_logprobs,
            ref_logprobs=ref_logprobs,
            rollout_logprobs=rollout_logprobs,
            advantages=advantages,
            weights=weights,
            scale_grad=scale_grad,
            sample_ids=sample_ids,
            group_ids=group_ids,
            logits=logits,
            hidden=hidden,
            clipped=clipped,
            extra=extra,
        )
        dev = logprobs.device
        mask_b = torch.ones(N, T, dtype=torch.bool, device=dev) if mask is None else mask.to(torch.bool)
        # a model's vocabulary may be larger than its tokenizer's, so only logits give the bound
        vocab = logits.shape[-1] if logits is not None else None
        check_ids(token_ids, mask_b, vocab, _ids(sample_ids, N, dev))
        in_loss = mask_b if loss_mask is None else (loss_mask.to(torch.bool) & mask_b)
        tensors = self._values(
            logprobs,
            token_ids,
            mask_b,
            old_logprobs,
            ref_logprobs,
            advantages,
            weights,
            logits,
            stats,
            hidden,
        )
        if rollout_logprobs is not None:
            tensors["rollout_logprob"] = rollout_logprobs.detach().float()
        p = _Pass(
            len(self._passes),
            int(update_id),
            logprobs,
            tensors,
            token_ids.detach(),
            mask_b,
            in_loss,
            _ids(sample_ids, N, dev),
            _ids(group_ids, N, dev),
            None if scale_grad is None else scale_grad.detach().to(logprobs.dtype),
            None if clipped is None else clipped.detach().to(torch.bool),
            {k: v.detach() for k, v in (extra or {}).items()},
        )
        p.recompute = recompute if self.attribution is not None else None
        if logprobs.requires_grad:
            p.handle = logprobs.register_hook(self._make_hook(p))
        else:
            warnings.warn(
                "tokengrad: tracked logprobs do not require grad; coef will be missing",
                RuntimeWarning,
                stacklevel=2,
            )
        self._passes.append(p)
        self._t_record += time.perf_counter() - t
        return logprobs

    @torch.no_grad()
    def _values(self, logprobs, token_ids, mask, old, ref, adv, weights, logits, stats, hidden) -> dict:
        lp = logprobs.detach().float()  # [N, T]
        if stats is None and logits is not None:
            stats = token_stats(logits.detach(), token_ids, mask)
        out = {"logprob": lp}
        if stats is not None:  # fields left None (e.g. no sum_p2 available) stay null columns
            fields = stats._asdict().items()
            out.update({k: v.detach().float() for k, v in fields if k != "logprob" and v is not None})
        if "prob" not in out:  # without logits the probability still follows from log pi
            out["prob"] = lp.exp()
        if old is not None:
            out["old_logprob"] = old.detach().float()
            out["ratio"] = (lp - out["old_logprob"]).exp()  # [N, T]
        if ref is not None:
            out["ref_logprob"] = ref.detach().float()
        if adv is not None:
            adv = adv.detach().float()
            out["advantage"] = adv.unsqueeze(1).expand_as(lp) if adv.dim() == 1 else adv
        out["weight"] = torch.ones_like(lp) if weights is None else weights.detach().float()
        if hidden is not None:
            out["_hidden_norm"] = hidden.detach().float().norm(dim=-1)  # [N, T] |h_t|
        return out

    def _make_hook(self, p: _Pass):
        def hook(grad: torch.Tensor):
            if self._in_bucket_backward:  # bucket passes feed coef back in: leave them alone
                return None
            g = grad if p.scale is None else grad * p.scale  # [N, T]
            c = g.detach()
            p.coef = c.clone() if p.coef is None else p.coef + c
            return None if p.scale is None else g

        return hook

    # ---- backward and gradients --------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """loss.backward(); on bucket steps keeps the graph for the bucket passes, then frees it."""
        if not self.is_bucket_step:
            loss.backward(**kwargs)
            return
        loss.backward(retain_graph=True, **kwargs)
        self.analyze_buckets()

    def analyze_buckets(self) -> None:
        """Bucket gradients of the passes tracked since the last call (their graphs must still exist)."""
        t = time.perf_counter()
        params = [p for _, p in trainable_params(self.rec.model)]
        edges = self.rec.bucket_edges
        nb = len(edges) - 1
        for p in [p for p in self._passes if not p.bucketed]:
            p.bucketed = True
            if p.coef is None or p.logprobs.grad_fn is None:
                continue
            idx = bk.bucket_index(p.tensors["prob"], edges)  # [N, T]
            self._in_bucket_backward = True
            try:
                grads = bk.bucket_gradients(p.logprobs, p.coef, p.in_loss, idx, nb, params)
            finally:
                self._in_bucket_backward = False
            state = self._bucket_state.setdefault(p.update_id, BucketState([None] * nb, [0] * nb))
            bk.accumulate(state.grads, grads)
            for b in range(nb):
                state.n_tokens[b] += int(((idx == b) & p.in_loss).sum())
        self._t_record += time.perf_counter() - t

    def take_open_buckets(self, update_id: int) -> BucketState | None:
        """Hand over the bucket gradients of an update that has no optimizer step yet, for an update that
        spans steps (TRL accumulating over generation batches); `continue_buckets` on the next step."""
        return self._bucket_state.pop(update_id, None)

    def continue_buckets(self, analyze: bool, state: BucketState | None, update_id: int = 0) -> None:
        """Carry on an update begun in the previous step: its bucket analysis goes on (with the gradients
        `take_open_buckets` took) or stays off, whatever this step's own schedule says."""
        self.is_bucket_step = analyze and self.rec.model is not None
        if state is not None:
            self._bucket_state[update_id] = state

    def record_grad_norms(self, update_id: int = 0) -> float:
        """Total and per-block gradient norms of the update, read before clipping; returns the total."""
        if self.rec.model is None:
            raise ValueError("record_grad_norms needs Recorder(model=...)")
        t = time.perf_counter()
        named = trainable_params(self.rec.model)
        if grads_are_sharded(self.rec.model):  # FSDP: each rank holds a shard; sum squared norms over ranks
            total, blocks = global_grad_norms(self.rec.model, self.rec.layers)
        else:  # one process or DDP (already all-reduced): read locally
            total, blocks = grad_norms(named, self.rec.layers)
        if self.attribution is not None:  # shares along g, read before clipping changes .grad
            self.attribution.on_gradient(self._passes, update_id, total * total)
        self.add_grad_norms(total, blocks, update_id)
        if update_id in self._bucket_state:
            self._finish_buckets(
                update_id, [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in named]
            )
        if self.attribution is not None and not any(r["update_id"] == update_id for r in self._bucket_rows):
            self._bucket_rows += bucket_share_rows(
                self._passes,
                update_id,
                self.rec.bucket_edges,
                self.step,
                self.rec.rank,
                named[0][1].device if named else "cpu",
            )
        self._t_record += time.perf_counter() - t
        return total

    def add_grad_norms(self, total: float, blocks: dict[str, float], update_id: int = 0) -> None:
        """Record norms read elsewhere (e.g. through DeepSpeed's API, where `.grad` is partitioned)."""
        self._update_norms[update_id] = total
        rows = [{"layer": schema.TOTAL_LAYER, "grad_norm": total}]
        rows += [{"layer": b, "grad_norm": v} for b, v in blocks.items()]
        self._layer_rows += [dict(r, step=self.step, rank=self.rec.rank, update_id=update_id) for r in rows]

    def clip_grad_norm_(self, max_norm: float, update_id: int = 0) -> float:
        """record_grad_norms() then clip with the same total norm, reading the gradients once (the same
        scaling as torch.nn.utils.clip_grad_norm_: factor min(1, max_norm / (total + 1e-6))). Returns the
        total norm before clipping."""
        total = self.record_grad_norms(update_id)
        grads = [p.grad for _, p in trainable_params(self.rec.model) if p.grad is not None]
        factor = float(max_norm) / (total + 1e-6)
        if grads and factor < 1.0:
            torch._foreach_mul_(grads, factor)
        return total

    def _finish_buckets(self, update_id: int, total: list[torch.Tensor]) -> None:
        self._bucket_rows += bucket_rows(
            self._bucket_state.pop(update_id),
            total,
            self.rec.bucket_edges,
            step=self.step,
            rank=self.rec.rank,
            update_id=update_id,
        )

    def record_prob_change(self, new_logprobs: torch.Tensor, sample_ids: torch.Tensor | None = None) -> None:
        """After the step's updates: mean change of probability and correct ratio per pi_old bucket (AR-Lopti,
        arXiv 2505.12929, bins by pi_old), over the union of every tracked pass's in-loss tokens.

        Args:
            new_logprobs: [N, T] log-probs of rows `sample_ids` under the updated policy (one extra forward by
                the caller), scored as the loss scores them.
            sample_ids: [N] the rows' sample ids as tracked (default 0..N-1).

        Tokens with A = 0 are left out of the mean change (nothing pushed them); the correct ratio compares
        log-probs, so a rise too small for fp32 probabilities counts, and leaves out tokens already at p = 1.
        Written onto the bucket rows of the step's last update (rows with counts only when that update had
        no gradient analysis).
        """
        N, _ = new_logprobs.shape
        tracked = [
            (p.sample_ids, p.in_loss, p.tensors["old_logprob"], p.tensors.get("advantage"))
            for p in self._passes
            if "old_logprob" in p.tensors
        ]
        rows_ids = _ids(sample_ids, N, new_logprobs.device)
        in_loss, old, adv = bk.union_of_passes(rows_ids, tracked, new_logprobs)
        edges = self.rec.bucket_edges
        idx = bk.bucket_index(old.exp(), edges)  # [N, T] bucket of pi_old
        dmean, correct = bk.prob_change(old, new_logprobs.detach().float(), adv, in_loss, idx, len(edges) - 1)
        last = max(
            [r["update_id"] for r in self._bucket_rows],
            default=max([p.update_id for p in self._passes], default=0),
        )
        rows = [
            r for r in self._bucket_rows if r["update_id"] == last and r["bucket"] != schema.RESIDUAL_BUCKET
        ]
        if not rows:  # no gradient analysis this step: rows with counts and the change only
            n = [int(((idx == b) & in_loss).sum()) for b in range(len(edges) - 1)]
            rows = [
                dict(
                    step=self.step,
                    rank=self.rec.rank,
                    update_id=last,
                    bucket=schema.bucket_label(lo, hi),
                    lo=lo,
                    hi=hi,
                    n_tokens=n[b],
                    token_share=n[b] / max(sum(n), 1),
                )
                for b, (lo, hi) in enumerate(zip(edges, edges[1:]))
            ]
            self._bucket_rows += rows
        for r, d, c in zip(rows, dmean, correct):
            r["dprob_mean"], r["correct_ratio"] = d, c

    # ---- scalars and samples -----------------------------------------------------------------------
    def log(self, **scalars) -> None:
        """Per-step scalars (loss, reward_mean, kl, lr, time_*, or any new name -> an extra column)."""
        self._scalars.update(check_scalars(scalars, _NUMERIC_STEP_COLUMNS))

    def samples(
        self,
        *,
        sample_ids,
        group_ids,
        prompts=None,
        completions=None,
        rewards=None,
        advantages=None,
        lengths=None,
        task=None,
        difficulty=None,
        **extra,
    ) -> None:
        """One row per completion into the samples table; list-like arguments of equal length."""
        if RESERVED & set(extra):
            raise ValueError(f"samples(): {sorted(RESERVED & set(extra))} are set by the recorder; rename")
        cols = dict(
            sample_id=sample_ids,
            group_id=group_ids,
            prompt=prompts,
            completion=completions,
            reward=rewards,
            advantage=advantages,
            length=lengths,
            task=task,
            difficulty=difficulty,
            **extra,
        )
        self._samples += sample_rows(cols, step=self.step, rank=self.rec.rank)

    # ---- end of step -------------------------------------------------------------------------------
    def finish(self) -> dict:
        """Remove hooks, move captured tensors to numpy; row building is deferred to the writer thread."""
        t = time.perf_counter()
        for p in self._passes:
            if p.handle is not None:
                p.handle.remove()
            p.logprobs = None
        if self.attribution is not None:  # the last update's applied change, at the parameters after it
            self.attribution.finish(self._passes)
        self._bucket_state.clear()
        scalars, tables = dict(self._scalars), {}
        if self.rec.budget is not None and self._passes:
            captured = budgeted(
                self._passes,
                self.rec.budget,
                self.step,
                self.rec.rank,
                self.rec.bucket_edges,
                scalars,
                tables,
                self.rec.decode,
            )
        else:
            captured = [capture_pass(p) for p in self._passes]
        n_token_rows = sum(len(c.index[0]) if c.index is not None else int(c.mask.sum()) for c in captured)
        scalars.setdefault("n_token_rows", n_token_rows)
        self._t_record += time.perf_counter() - t
        scalars.setdefault("time_step", time.perf_counter() - self._t0)
        scalars.setdefault("time_record", self._t_record)
        if self._update_norms:
            scalars.setdefault("grad_norm", max(self._update_norms.values()))
        scalars.setdefault("n_updates", len({p.update_id for p in self._passes}) or None)
        step, rank, decode = self.step, self.rec.rank, self.rec.decode
        layer_rows, bucket_rows, sample_rows = self._layer_rows, self._bucket_rows, self._samples
        # Rows(build, n): built on the writer thread; n counts them exactly if building fails there
        return {
            "tokens": Rows(lambda: tokens_table(step, rank, captured, decode), n_token_rows),
            "steps": Rows(lambda: scalar_table("steps", [_steps_row(step, rank, scalars, captured)]), 1),
            "layers": Rows(lambda: scalar_table("layers", layer_rows), len(layer_rows)),
            "buckets": Rows(lambda: scalar_table("buckets", bucket_rows), len(bucket_rows)),
            "samples": Rows(lambda: scalar_table("samples", sample_rows), len(sample_rows)),
            **tables,
        }


def _steps_row(step: int, rank: int, scalars: dict, captured: list[CapturedBatch]) -> dict:
    derived = step_derived(captured)
    if derived.get("n_nonfinite"):
        warnings.warn(
            f"tokengrad: step {step}: {derived['n_nonfinite']} NaN/inf token values recorded as they are",
            RuntimeWarning,
            stacklevel=2,
        )
    return {**derived, **scalars, "step": step, "rank": rank}


def _ids(ids: torch.Tensor | None, n: int, dev) -> torch.Tensor:
    return torch.arange(n, device=dev) if ids is None else torch.as_tensor(ids, device=dev).long()
