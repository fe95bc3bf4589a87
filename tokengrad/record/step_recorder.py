"""One step of a recording: tracked passes, the coef hook, grad norms, buckets, scalars and samples.

A pass is one backward pass. A step may hold several (gradient-accumulation micro-batches, several
optimizer updates per rollout batch with num_iterations > 1 or PPO mini-batches, Lopti's two phases). Each
`track()` call is one pass (pass_id 0, 1, ...) and names the optimizer update it feeds (update_id); grad
norms and bucket figures are recorded per update_id and describe the gradient accumulated by all passes of
that update.
"""

from __future__ import annotations

import time
from dataclasses import fields

import pyarrow as pa
import torch

from tokengrad import schema
from tokengrad.record.attribution.spike_replay import replay_spike
from tokengrad.record.attribution.step import StepAttribution, bucket_share_rows
from tokengrad.record.buckets.passes import BucketPasses
from tokengrad.record.buckets.step import StepBuckets
from tokengrad.record.buckets.whatif import StepWhatIf
from tokengrad.record.budget.aggregates import vocab_table
from tokengrad.record.budget.kept_rows import BudgetedStep, capture_pass
from tokengrad.record.checks import RESERVED, as_ids, check_scalars, safe_texts
from tokengrad.record.distributed import global_grad_norms, grads_are_sharded
from tokengrad.record.gradnorms import grad_norms_for_clip, trainable_params
from tokengrad.record.host import HostHooks
from tokengrad.record.stats import TokenStats
from tokengrad.record.store.rows import sample_rows, scalar_table, steps_row, tokens_table
from tokengrad.record.store.writer import Rows
from tokengrad.record.tracked_pass import PassInputs, TrackedPass, build_pass

_NUMERIC_STEP_COLUMNS = {
    f.name
    for f in schema.arrow_schema("steps")
    if pa.types.is_floating(f.type) or pa.types.is_integer(f.type)
}


class StepRecorder:
    """One step of a `Recorder` (`rec.step(i)`), the handle a user's loop holds: each backward pass
    (`track`, `backward`), each update's gradient norms (`record_grad_norms`, `clip_grad_norm_`), the
    step's scalars (`log`), samples (`samples`) and probability change (`record_prob_change`). Its end
    (the `with` block: `finish`, or `discard` on Ctrl-C) hands the rows to the writer.

    Two objects hold the verbs of hosts that run the backward themselves: `bucket_passes` (the scheduled
    bucket analysis around a host's own backward, record/buckets/passes.py) and `host` (loss scale,
    norms read elsewhere, clip with the recorded norms, non-finite check; record/host.py).
    `bucket_step`, `attribute_step`: this step's schedule (both need the recorder's model)."""

    def __init__(
        self, recorder, step: int, bucket_step: bool, attribute_step: bool = False, whatif_step: bool = False
    ):
        self.rec = recorder
        self.step = step
        self.bucket_passes = BucketPasses(self, bucket_step)  # the bucket-pass verbs of a host's backward
        self.host = HostHooks(self)  # the verbs of a host that owns the backward, clip or scaler
        # the what-if updates of the rules in Recorder(whatif=...) on this step (record/buckets/whatif.py)
        on = whatif_step and recorder.model is not None
        self.whatif = StepWhatIf(recorder.whatif, recorder.bucket_edges, step, recorder.rank) if on else None
        self.attribution = self._new_attribution() if attribute_step and recorder.model is not None else None
        self._spike: dict = {}  # the replay columns of the step's largest spiking update (spike_replay.py)
        self.passes: list[TrackedPass] = []
        self.scalars: dict = {}
        self._samples: list[dict] = []
        self.layer_rows: list[dict] = []
        self.buckets = StepBuckets(recorder.bucket_edges, step, recorder.rank)
        self.update_norms: dict[int, float] = {}
        self.clip_totals: dict[int, torch.Tensor | None] = {}  # update -> torch's total norm, same read
        self._t0 = time.perf_counter()
        self.record_seconds = 0.0  # time spent recording (steps.time_record), bucket passes included
        # the factor the next backward's loss carries (fp16 gradient scaling): the coef hook divides by it
        self.loss_scale = 1.0

    def _new_attribution(self) -> StepAttribution:
        a = self.rec.attribution
        return StepAttribution(self.rec.model, a.method, a.eps, a.applied, a.entropy)

    def __enter__(self) -> "StepRecorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.rec.current_step is self:
            # Ctrl-C or SIGTERM mid-step: the step did not happen (a resume trains it again); another
            # error keeps what the step recorded so far, to show where it failed.
            if exc_type is not None and self._awaited():  # the others wait for this rank: release them
                self.rec.agreement.leave(step=self.step, n_values=len(self.rec.bucket_edges) - 1)
            if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
                self.rec.discard_step()
            else:
                self.rec.end_step()

    def _awaited(self) -> bool:
        """Whether the other ranks will wait for this one in record_grad_norms: sharded gradients with a
        tracked update whose norms were not read yet."""
        pending = {p.update_id for p in self.passes} - set(self.update_norms)
        return bool(pending) and self.rec.agreement is not None and grads_are_sharded(self.rec.model)

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
        is_weights: torch.Tensor | None = None,
        mask_codes: torch.Tensor | None = None,
        advantages: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
        scale_grad: torch.Tensor | None = None,
        sample_ids: torch.Tensor | None = None,
        group_ids: torch.Tensor | None = None,
        logits: torch.Tensor | None = None,
        stats: TokenStats | None = None,
        hidden: torch.Tensor | None = None,
        clipped: torch.Tensor | None = None,
        policy_versions: torch.Tensor | int | None = None,
        trainer_version: int | None = None,
        update_id: int = 0,
        extra: dict[str, torch.Tensor] | None = None,
        recompute=None,
    ) -> torch.Tensor:
        """Track one backward pass's [N, T] log-probs (with graph; a hook reads coef = dL/d log pi per
        token) and return them; its loss must be backpropagated before the next update's norms are read.
        Every keyword but `update_id` (the optimizer update this pass feeds) and `recompute` (() -> these
        log-probs again, for attribution steps; with Attribution(entropy=True) (log-probs, entropy)) is a
        PassInputs field: shapes and columns in docs/api.md, "st.track(logprobs, ...)"."""
        given = locals()  # first: track's keywords are PassInputs' fields (tests/record/test_tracked_pass.py)
        inputs = PassInputs(**{f.name: given[f.name] for f in fields(PassInputs)})
        t = time.perf_counter()
        # recompute is kept where this step may be attributed: on schedule, or on a spike found in
        # record_grad_norms
        wanted = self.attribution is not None or self.rec.spike_watch is not None
        p = build_pass(
            len(self.passes),
            logprobs,
            inputs,
            update_id=int(update_id),
            recompute=recompute if wanted else None,
        )
        # bucket passes feed coef back in; a scaled loss's coef is recorded unscaled
        p.watch_coef(paused=lambda: self.buckets.in_backward, loss_scale=lambda: self.loss_scale)
        self.passes.append(p)
        self.record_seconds += time.perf_counter() - t
        return logprobs

    # ---- backward and gradients --------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, loss_scale: float | None = None, **kwargs) -> None:
        """loss.backward(); on bucket steps keeps the graph for the bucket passes, then frees it.
        `loss_scale`: the factor `loss` carries, under an fp16 gradient scaler
        `st.backward(scaler.scale(loss), loss_scale=scaler.get_scale())`; coef is recorded divided by it
        and the step logs it (steps.loss_scale). Unscale the gradients (`scaler.unscale_(opt)`) before
        `st.clip_grad_norm_`, as for any clip."""
        if loss_scale is not None:
            self.host.set_loss_scale(loss_scale)
        if not self.bucket_passes.keeps_graph:
            loss.backward(**kwargs)
            return
        self.bucket_passes.before_backward()
        loss.backward(retain_graph=True, **kwargs)
        self.bucket_passes.analyze(loss)

    def record_grad_norms(self, update_id: int = 0) -> float:
        """Total and per-block gradient norms of the update, read before clipping; returns the total."""
        if self.rec.model is None:
            raise ValueError("record_grad_norms needs Recorder(model=...)")
        t = time.perf_counter()
        named = trainable_params(self.rec.model)
        sharded = grads_are_sharded(self.rec.model)
        if sharded:  # FSDP: each rank holds a shard; sum squared norms over ranks, all ranks there first
            agreed = self.buckets.agree_sharded(update_id, self.rec.agreement, self.bucket_passes.scheduled)
            total, blocks = global_grad_norms(self.rec.model, self.rec.layers)
            self.clip_totals[update_id] = None
        else:  # one process or DDP (already all-reduced): read locally
            total, blocks, self.clip_totals[update_id] = grad_norms_for_clip(named, self.rec.layers)
        spiked = self._watch_spike(total)
        if self.attribution is not None:  # shares along g, read before clipping changes .grad
            self.attribution.on_gradient(self.passes, update_id, total * total)
        if spiked:  # the same gradient without its top-k culprit tokens
            self._replay(update_id, total, named)
        self.host.add_grad_norms(total, blocks, update_id)
        if self.bucket_passes.scheduled and sharded:  # every rank, its passes or none
            self.buckets.finish_sharded(update_id, self.rec.model, *agreed)
        elif update_id in self.buckets.state:
            self.buckets.finish_update(
                update_id, [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in named]
            )
        if self.whatif is not None:
            self.whatif.finish_update(
                update_id, [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in named]
            )
        if self.attribution is not None and not self.buckets.has_rows(update_id):
            device = named[0][1].device if named else "cpu"
            self.buckets.rows += bucket_share_rows(
                self.passes,
                update_id,
                edges=self.rec.bucket_edges,
                step=self.step,
                rank=self.rec.rank,
                device=device,
            )
        self.record_seconds += time.perf_counter() - t
        return total

    def _watch_spike(self, total: float) -> bool:
        """Attribution(on_spike=True): whether this update's pre-clip norm is a spike against the steps so
        far; a spike starts the step's attribution if its schedule had not."""
        watch = self.rec.spike_watch
        if watch is None:
            return False
        spiked, z = watch.flags(total)
        if spiked and self.attribution is None:
            self.attribution = self._new_attribution()
        return spiked

    def _replay(self, update_id: int, total: float, named: list) -> None:
        if self._spike and self._spike["norm"] >= total:  # the step's largest spiking update is kept
            return
        mine = [p for p in self.passes if p.update_id == update_id]
        cols = replay_spike(mine, named, self.attribution.world, self.rec.spike_watch)
        self._spike = {"norm": total, "spike_z": self.rec.spike_watch.z(total), **cols}

    def clip_grad_norm_(self, max_norm: float, update_id: int = 0) -> float:
        """record_grad_norms() then clip with the same norm, reading the gradients once: the gradients end
        bitwise as `torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)` leaves them (its total
        norm is taken from the per-parameter norms the recorder reads). Returns the total norm before
        clipping."""
        total = self.record_grad_norms(update_id)
        self.host.clip_recorded_(max_norm, update_id)
        return total

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
        rows_ids = as_ids(sample_ids, new_logprobs.shape[0], new_logprobs.device)
        self.buckets.prob_change(self.passes, new_logprobs, rows_ids)

    # ---- scalars and samples -----------------------------------------------------------------------
    def log(self, **scalars) -> None:
        """Per-step scalars (loss, reward_mean, kl, lr, time_*, or any new name -> an extra column)."""
        self.scalars.update(check_scalars(scalars, _NUMERIC_STEP_COLUMNS))

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
        cols = {k: safe_texts(v, f"samples(): {k}") for k, v in cols.items()}
        self._samples += sample_rows(cols, step=self.step, rank=self.rec.rank)

    # ---- end of step -------------------------------------------------------------------------------
    def discard(self) -> None:
        """Drop the step: its hooks removed, nothing of it recorded."""
        for p in self.passes:
            p.unwatch_coef()
        self.buckets.close()
        self.passes, self._samples, self.scalars = [], [], {}

    def finish(self) -> dict:
        """Remove hooks, move captured tensors to numpy; row building is deferred to the writer thread."""
        t = time.perf_counter()
        for p in self.passes:
            p.unwatch_coef()
            p.logprobs = None
        self.buckets.close()
        if self.attribution is not None:  # the last update's applied change, at the parameters after it
            self.attribution.finish(self.passes)
        self.buckets.state.clear()
        scalars, tables = dict(self.scalars), {}
        if self.attribution is not None:  # the step's entropy change and Cov(log pi, A), before sampling
            for k, v in self.attribution.scalars().items():
                scalars.setdefault(k, v)
        step, rank, decode = self.step, self.rec.rank, self.rec.decode
        if self.rec.budget is not None and self.passes:
            # kept rows and exact aggregates: computed now on an accelerator, on the writer thread on the CPU
            kept = BudgetedStep(self.passes, self.rec.budget, step, rank, self.rec.bucket_edges)
            n_token_rows = kept.n_rows
            captured = lambda: kept.result().batches
            step_scalars = lambda: {**kept.result().scalars, **scalars}  # logged scalars win
            tables["prob_bins"] = lambda: scalar_table("prob_bins", kept.result().prob_bins)
            tables["vocab"] = lambda: vocab_table(step, rank, kept.result().vocab, decode)
        else:
            batches = [capture_pass(p) for p in self.passes]
            n_token_rows = sum(int(c.mask.sum()) for c in batches)
            captured, step_scalars = (lambda: batches), (lambda: scalars)
        scalars.setdefault("n_token_rows", n_token_rows)
        self.record_seconds += time.perf_counter() - t
        scalars.setdefault("time_step", time.perf_counter() - self._t0)
        scalars.setdefault("time_record", self.record_seconds)
        if self.update_norms:
            scalars.setdefault("grad_norm", max(self.update_norms.values()))
        scalars.setdefault("n_updates", len({p.update_id for p in self.passes}) or None)
        scalars.update({k: v for k, v in self._spike.items() if k != "norm"})
        if self.rec.spike_watch is not None and self.update_norms:
            self.rec.spike_watch.add(max(self.update_norms.values()))
        layer_rows, bucket_rows, sample_rows = self.layer_rows, self.buckets.rows, self._samples
        whatif_rows = self.whatif.rows if self.whatif is not None else []
        # Rows(build, n): built on the writer thread; n counts them exactly if building fails there
        return {
            "tokens": Rows(lambda: tokens_table(step, rank, captured(), decode), n_token_rows),
            "steps": Rows(
                lambda: scalar_table("steps", [steps_row(step, rank, step_scalars(), captured())]), 1
            ),
            "layers": Rows(lambda: scalar_table("layers", layer_rows), len(layer_rows)),
            "buckets": Rows(lambda: scalar_table("buckets", bucket_rows), len(bucket_rows)),
            "samples": Rows(lambda: scalar_table("samples", sample_rows), len(sample_rows)),
            "whatif": Rows(lambda: scalar_table("whatif", whatif_rows), len(whatif_rows)),
            **tables,
        }
