"""One step of a recording: tracked passes, the coef hook, grad norms, buckets, scalars and samples.

A pass is one backward pass. A step may hold several (gradient-accumulation micro-batches, several
optimizer updates per rollout batch with num_iterations > 1 or PPO mini-batches, Lopti's two phases). Each
`track()` call is one pass (pass_id 0, 1, ...) and names the optimizer update it feeds (update_id); grad
norms and bucket figures are recorded per update_id and describe the gradient accumulated by all passes of
that update.
"""

from __future__ import annotations

import math
import time
from dataclasses import fields

import pyarrow as pa
import torch

from tokengrad import schema
from tokengrad.record.bucket_rows import BucketState
from tokengrad.record.budget import BudgetedStep, capture_pass
from tokengrad.record.budget_aggregates import vocab_table
from tokengrad.record.checks import RESERVED, as_ids, check_scalars, safe_texts
from tokengrad.record.distributed import global_grad_norms, grads_are_sharded
from tokengrad.record.gradnorms import clip_with_norm_, grad_norms_for_clip, trainable_params
from tokengrad.record.rows import sample_rows, scalar_table, steps_row, tokens_table
from tokengrad.record.spike_replay import replay_spike
from tokengrad.record.stats import TokenStats
from tokengrad.record.step_attribution import StepAttribution, bucket_share_rows
from tokengrad.record.step_buckets import StepBuckets
from tokengrad.record.tracked_pass import PassInputs, TrackedPass, build_pass
from tokengrad.record.whatif import StepWhatIf
from tokengrad.record.writer import Rows

_NUMERIC_STEP_COLUMNS = {
    f.name
    for f in schema.arrow_schema("steps")
    if pa.types.is_floating(f.type) or pa.types.is_integer(f.type)
}


class StepRecorder:
    """One step of a `Recorder` (`rec.step(i)`): each backward pass (`track`), each update's gradient norms
    (`record_grad_norms`, `clip_grad_norm_`), the scheduled bucket analysis and attribution, the step's
    scalars (`log`) and samples (`samples`). Its end (the `with` block, `rec.end_step()`) hands the rows
    to the writer; Ctrl-C drops them. `bucket_step`, `attribute_step`: this step's schedule (both need the
    recorder's model)."""

    def __init__(
        self, recorder, step: int, bucket_step: bool, attribute_step: bool = False, whatif_step: bool = False
    ):
        self.rec = recorder
        self.step = step
        self.is_bucket_step = bucket_step and recorder.model is not None
        # the what-if updates of the rules in Recorder(whatif=...) on this step (record/whatif.py)
        on = whatif_step and recorder.model is not None
        self.whatif = StepWhatIf(recorder.whatif, recorder.bucket_edges, step, recorder.rank) if on else None
        self.attribution = self._new_attribution() if attribute_step and recorder.model is not None else None
        self._spike: dict = {}  # the replay columns of the step's largest spiking update (spike_replay.py)
        self._passes: list[TrackedPass] = []
        self._scalars: dict = {}
        self._samples: list[dict] = []
        self._layer_rows: list[dict] = []
        self.buckets = StepBuckets(recorder.bucket_edges, step, recorder.rank)
        self._update_norms: dict[int, float] = {}
        self._clip_total: dict[
            int, torch.Tensor | None
        ] = {}  # update -> torch's total norm, from the same read
        self._t0 = time.perf_counter()
        self._t_record = 0.0
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
            if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
                self.rec.discard_step()
            else:
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
        given = locals()  # first: track's keywords are PassInputs' fields (tests/test_tracked_pass.py)
        inputs = PassInputs(**{f.name: given[f.name] for f in fields(PassInputs)})
        t = time.perf_counter()
        # recompute is kept where this step may be attributed: on schedule, or on a spike found in
        # record_grad_norms
        wanted = self.attribution is not None or self.rec.spike_watch is not None
        p = build_pass(
            len(self._passes),
            logprobs,
            inputs,
            update_id=int(update_id),
            recompute=recompute if wanted else None,
        )
        # bucket passes feed coef back in; a scaled loss's coef is recorded unscaled
        p.watch_coef(paused=lambda: self.buckets.in_backward, loss_scale=lambda: self.loss_scale)
        self._passes.append(p)
        self._t_record += time.perf_counter() - t
        return logprobs

    # ---- backward and gradients --------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, loss_scale: float | None = None, **kwargs) -> None:
        """loss.backward(); on bucket steps keeps the graph for the bucket passes, then frees it.
        `loss_scale`: the factor `loss` carries, under an fp16 gradient scaler
        `st.backward(scaler.scale(loss), loss_scale=scaler.get_scale())`; coef is recorded divided by it
        and the step logs it (steps.loss_scale). Unscale the gradients (`scaler.unscale_(opt)`) before
        `st.clip_grad_norm_`, as for any clip."""
        if loss_scale is not None:
            self.set_loss_scale(loss_scale)
        if not self.keeps_graph:
            loss.backward(**kwargs)
            return
        if self.is_bucket_step:
            self.before_bucket_backward()
        loss.backward(retain_graph=True, **kwargs)
        self.analyze_passes(loss)

    @property
    def keeps_graph(self) -> bool:
        """The backward of this step's passes keeps their graph for the bucket or what-if passes."""
        return self.is_bucket_step or self.whatif is not None

    def analyze_passes(self, loss: torch.Tensor | None = None) -> None:
        """After a backward that kept the graph: the what-if gradients of the passes tracked since, then
        their bucket gradients (`analyze_buckets`); the last of them frees the graph."""
        if self.whatif is not None:
            t = time.perf_counter()
            self.buckets.in_backward = True  # the coef hook leaves these backwards alone
            try:
                named = trainable_params(self.rec.model)
                self.whatif.analyze(self._passes, named, keep_graph=self.is_bucket_step)
            finally:
                self.buckets.in_backward = False
            self._t_record += time.perf_counter() - t
        if self.is_bucket_step:
            self.analyze_buckets(loss)

    def set_loss_scale(self, loss_scale: float) -> None:
        """The fp16 gradient scaler's scale the next backward's loss carries: coef is recorded divided by
        it, and the step logs it (steps.loss_scale), so that an update the scaler skips for overflow is
        not read as a non-finite model."""
        if not (isinstance(loss_scale, (int, float)) and math.isfinite(loss_scale) and loss_scale > 0):
            raise ValueError(f"loss_scale must be a finite number > 0, got {loss_scale!r}")
        self.loss_scale = float(loss_scale)
        self._scalars["loss_scale"] = self.loss_scale

    def before_bucket_backward(self) -> None:
        """Before the backward that analyze_buckets(loss) follows: whether an update begins from empty
        gradients (so that one bucket can be derived as g minus the others)."""
        if not grads_are_sharded(self.rec.model):
            self.buckets.before_backward(self._passes, [p for _, p in trainable_params(self.rec.model)])

    def analyze_buckets(self, loss: torch.Tensor | None = None) -> None:
        """Bucket gradients of the passes tracked since the last call (their graphs must still exist);
        `loss`, the tensor their backward ran on, lets a residual-free update skip one bucket's pass."""
        t = time.perf_counter()
        self.buckets.analyze(self._passes, trainable_params(self.rec.model), loss=loss)
        self._t_record += time.perf_counter() - t

    def skip_bucket_analysis(self) -> None:
        """No bucket analysis this step after all, though it was scheduled: under several processes the
        buckets are all-reduced, so a step in which some rank trains on no rows records none (nor what-if
        updates, all-reduced too)."""
        self.is_bucket_step = False
        self.whatif = None

    def take_open_buckets(self, update_id: int) -> BucketState | None:
        """Hand over the bucket gradients of an update that has no optimizer step yet, for an update that
        spans steps (TRL accumulating over generation batches); `continue_buckets` on the next step."""
        return self.buckets.state.pop(update_id, None)

    def continue_buckets(self, analyze: bool, state: BucketState | None, update_id: int = 0) -> None:
        """Carry on an update begun in the previous step: its bucket analysis goes on (with the gradients
        `take_open_buckets` took) or stays off, whatever this step's own schedule says."""
        self.is_bucket_step = analyze and self.rec.model is not None
        if state is not None:
            self.buckets.state[update_id] = state
        if self.whatif is not None:  # its first passes' what-if gradients were not carried
            self.whatif.skip_update(update_id)

    def record_grad_norms(self, update_id: int = 0) -> float:
        """Total and per-block gradient norms of the update, read before clipping; returns the total."""
        if self.rec.model is None:
            raise ValueError("record_grad_norms needs Recorder(model=...)")
        t = time.perf_counter()
        named = trainable_params(self.rec.model)
        if grads_are_sharded(self.rec.model):  # FSDP: each rank holds a shard; sum squared norms over ranks
            total, blocks = global_grad_norms(self.rec.model, self.rec.layers)
            self._clip_total[update_id] = None
        else:  # one process or DDP (already all-reduced): read locally
            total, blocks, self._clip_total[update_id] = grad_norms_for_clip(named, self.rec.layers)
        spiked = self._watch_spike(total)
        if self.attribution is not None:  # shares along g, read before clipping changes .grad
            self.attribution.on_gradient(self._passes, update_id, total * total)
        if spiked:  # the same gradient without its top-k culprit tokens
            self._replay(update_id, total, named)
        self.add_grad_norms(total, blocks, update_id)
        if update_id in self.buckets.state:
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
                self._passes,
                update_id,
                edges=self.rec.bucket_edges,
                step=self.step,
                rank=self.rec.rank,
                device=device,
            )
        self._t_record += time.perf_counter() - t
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
        mine = [p for p in self._passes if p.update_id == update_id]
        cols = replay_spike(mine, named, self.attribution.world, self.rec.spike_watch)
        self._spike = {"norm": total, "spike_z": self.rec.spike_watch.z(total), **cols}

    def add_grad_norms(self, total: float, blocks: dict[str, float], update_id: int = 0) -> None:
        """Record norms read elsewhere (e.g. through DeepSpeed's API, where `.grad` is partitioned)."""
        self._update_norms[update_id] = total
        rows = [{"layer": schema.TOTAL_LAYER, "grad_norm": total}]
        rows += [{"layer": b, "grad_norm": v} for b, v in blocks.items()]
        self._layer_rows += [dict(r, step=self.step, rank=self.rec.rank, update_id=update_id) for r in rows]

    def clip_grad_norm_(self, max_norm: float, update_id: int = 0) -> float:
        """record_grad_norms() then clip with the same norm, reading the gradients once: the gradients end
        bitwise as `torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)` leaves them (its total
        norm is taken from the per-parameter norms the recorder reads). Returns the total norm before
        clipping."""
        total = self.record_grad_norms(update_id)
        self.clip_recorded_(max_norm, update_id)
        return total

    def clip_recorded_(self, max_norm: float, update_id: int = 0) -> torch.Tensor:
        """Clip the gradients of the update whose norms `record_grad_norms` just read, as
        `torch.nn.utils.clip_grad_norm_` would, without reading them again where torch's total norm came
        from that read (float32 gradients on one device, not sharded); returns torch's total norm."""
        grads = [p.grad for _, p in trainable_params(self.rec.model) if p.grad is not None]
        clip_total = self._clip_total.get(update_id)
        if clip_total is not None:
            clip_with_norm_(grads, max_norm, clip_total)
            return clip_total
        if grads_are_sharded(self.rec.model):  # each rank clips its shard with the global norm
            clip_total = torch.tensor(
                self._update_norms[update_id], device=grads[0].device if grads else "cpu"
            )
            clip_with_norm_(grads, max_norm, clip_total)
            return clip_total
        return torch.nn.utils.clip_grad_norm_([p for _, p in trainable_params(self.rec.model)], max_norm)

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
        self.buckets.prob_change(self._passes, new_logprobs, rows_ids)

    # ---- scalars and samples -----------------------------------------------------------------------
    def log(self, **scalars) -> None:
        """Per-step scalars (loss, reward_mean, kl, lr, time_*, or any new name -> an extra column)."""
        self._scalars.update(check_scalars(scalars, _NUMERIC_STEP_COLUMNS))

    def nonfinite(self) -> bool:
        """Whether the step logged a NaN/inf loss or gradient norm: with Doctor(halt=True) the recorder then
        diagnoses the step as soon as it is on disk, so the next step boundary halts (a live diagnosis
        alone could land a step or two later)."""
        values = [self._scalars.get("loss"), self._scalars.get("grad_norm"), *self._update_norms.values()]
        return any(isinstance(v, float) and not math.isfinite(v) for v in values)

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
        for p in self._passes:
            p.unwatch_coef()
        self.buckets.close()
        self._passes, self._samples, self._scalars = [], [], {}

    def finish(self) -> dict:
        """Remove hooks, move captured tensors to numpy; row building is deferred to the writer thread."""
        t = time.perf_counter()
        for p in self._passes:
            p.unwatch_coef()
            p.logprobs = None
        self.buckets.close()
        if self.attribution is not None:  # the last update's applied change, at the parameters after it
            self.attribution.finish(self._passes)
        self.buckets.state.clear()
        scalars, tables = dict(self._scalars), {}
        if self.attribution is not None:  # the step's entropy change and Cov(log pi, A), before sampling
            for k, v in self.attribution.scalars().items():
                scalars.setdefault(k, v)
        step, rank, decode = self.step, self.rec.rank, self.rec.decode
        if self.rec.budget is not None and self._passes:
            # kept rows and exact aggregates: computed now on an accelerator, on the writer thread on the CPU
            kept = BudgetedStep(self._passes, self.rec.budget, step, rank, self.rec.bucket_edges)
            n_token_rows = kept.n_rows
            captured = lambda: kept.result().batches
            step_scalars = lambda: {**kept.result().scalars, **scalars}  # logged scalars win
            tables["prob_bins"] = lambda: scalar_table("prob_bins", kept.result().prob_bins)
            tables["vocab"] = lambda: vocab_table(step, rank, kept.result().vocab, decode)
        else:
            batches = [capture_pass(p) for p in self._passes]
            n_token_rows = sum(int(c.mask.sum()) for c in batches)
            captured, step_scalars = (lambda: batches), (lambda: scalars)
        scalars.setdefault("n_token_rows", n_token_rows)
        self._t_record += time.perf_counter() - t
        scalars.setdefault("time_step", time.perf_counter() - self._t0)
        scalars.setdefault("time_record", self._t_record)
        if self._update_norms:
            scalars.setdefault("grad_norm", max(self._update_norms.values()))
        scalars.setdefault("n_updates", len({p.update_id for p in self._passes}) or None)
        scalars.update({k: v for k, v in self._spike.items() if k != "norm"})
        if self.rec.spike_watch is not None and self._update_norms:
            self.rec.spike_watch.add(max(self._update_norms.values()))
        layer_rows, bucket_rows, sample_rows = self._layer_rows, self.buckets.rows, self._samples
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
