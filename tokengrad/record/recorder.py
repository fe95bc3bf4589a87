"""The recorder: a training loop drives it step by step; it writes the run format in the background.

    with Recorder("runs/demo", model=model, tokenizer=tok, buckets=10) as rec:
        for step in range(n_steps):
            with rec.step(step) as st:
                logprobs = ...                                    # [N, T] log pi the loss is built from
                st.track(logprobs, token_ids=ids, mask=mask, old_logprobs=old, advantages=adv,
                         sample_ids=sid, group_ids=gid, logits=logits)
                loss = my_loss(logprobs, ...)
                st.backward(loss)                                 # loss.backward() + bucket analysis
                st.record_grad_norms()                            # before clipping
                clip_grad_norm_(...); opt.step(); opt.zero_grad()
                st.log(loss=loss.item(), lr=lr)

The exact per-token loss coefficient coef = dL/dlog pi_t is read by an autograd hook on the tracked
log-probs tensor, so it is right for any loss built on log pi (PPO-clip, asymmetric clip, KL, any
aggregation) without re-deriving it. Hooks live only between track() and the end of the step; nothing is
set on the user's modules.
"""

from __future__ import annotations

import operator
import os
import warnings
from pathlib import Path

import torch

from tokengrad import schema
from tokengrad.read import layout
from tokengrad.record import distributed as dist
from tokengrad.record.attribution.spike_replay import SpikeWatch
from tokengrad.record.buckets.agreement import RankAgreement
from tokengrad.record.buckets.sharded import refuse_sharding
from tokengrad.record.buckets.whatif import WhatIf, as_whatif
from tokengrad.record.budget.kept_rows import Budget
from tokengrad.record.gradnorms import NamesFilter
from tokengrad.record.options import (
    Attribution,
    Buckets,
    Doctor,
    DoctorHalt,
    Output,
    RunInfo,
    as_attribution,
    as_buckets,
    as_budget,
    as_doctor,
    refuse_flat_keywords,
)
from tokengrad.record.step_recorder import StepRecorder
from tokengrad.record.store import claim, run_meta
from tokengrad.record.store.bucket import BucketRun
from tokengrad.record.store.rows import TokenDecoder, scalar_table
from tokengrad.record.store.writer import Rows, RunWriter

MAX_STEP = 2**31 - 1  # the step column is int32


class Recorder:
    """Records a training run into a run directory (see tokengrad.schema for the format).

    Args:
        run_dir: directory of the run (created; an existing run is appended to, e.g. on resume), or its
            URL in a bucket (`s3://bucket/prefix/run`): committed locally, uploaded in the background
            (tokengrad.record.store.bucket).
        model: the model being trained (for gradient norms and bucket analysis); DDP wrappers are fine.
        tokenizer: decodes token ids into the `token` column (optional).
        config: the full training config (stored in meta.json).
        info: `RunInfo`: the run's name, the model's name, the weighting rule, the sampling temperature.
        buckets: `Buckets(every, edges)`, or N: the probability-bucket analysis every N steps (0 = never).
        attribution: `Attribution(every, method, eps, applied, entropy, on_spike)`, or N: each token's exact
            share of the update every N steps (passes tracked with `recompute=`; record/attribution/step.py);
            `on_spike` also on gradient-norm spikes, with the replay without the top culprits.
        budget: `Budget(k, ...)`, or k: at most k token rows per step and rank (None = all): whole sampled
            sequences plus the largest |update_share| (else gradient norm) tokens, flagged in
            `selected_by`; steps, buckets, prob_bins and vocab stay exact over all tokens (budget/).
        whatif: `WhatIf(rules, every, buckets, loss, max_grad_norm)`: every N steps, the gradient each
            rule of `rules` would have produced from the same parameters on the same passes (the `whatif`
            table; record/buckets/whatif.py), without touching `.grad` or the optimizer.
        output: `Output(on_error, compact_every, trackers)`: writer failures, compaction, live trackers.
        doctor: `Doctor(halt, on_finding, min_confidence, ...)` or True: the detectors of tokengrad.doctor
            on committed steps, off the training thread (rank 0); alerts to the trackers and `on_finding`;
            with halt, `begin_step` raises `DoctorHalt` after a critical finding.
        layers: which top-level blocks get a grad-norm row (None = all; a name, list, or predicate).
        resume_step: continuing a run from a checkpoint taken before this step: rows already recorded for
            steps >= resume_step (after the checkpoint) are removed on open, so no step appears twice.
            Without it, a directory that holds another run (a different run_name, config, model or
            weighting in meta.json) is refused, and so is one written by a newer run-format version.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        model: torch.nn.Module | None = None,
        tokenizer=None,
        config: dict | None = None,
        *,
        info: RunInfo | None = None,
        buckets: Buckets | int = 0,
        attribution: Attribution | int = 0,
        budget: Budget | int | None = None,
        whatif: WhatIf | None = None,
        output: Output | None = None,
        doctor: Doctor | bool | None = None,
        layers: NamesFilter = None,
        resume_step: int | None = None,
        **unknown,
    ):
        if unknown:
            refuse_flat_keywords(unknown)  # an earlier release's flat keyword: its grouped form
            raise TypeError(f"Recorder() got unexpected keyword(s) {sorted(unknown)} (see docs/api.md)")
        info, output = info or RunInfo(), output or Output()
        self.buckets, self.attribution = as_buckets(buckets), as_attribution(attribution)
        self.budget, self.whatif = as_budget(budget), as_whatif(whatif)
        self.bucket = BucketRun.at(run_dir)  # None for a local folder; a bad URL is refused here
        self.run_dir = self.bucket.staging if self.bucket else Path(run_dir)
        self.model = model
        self.layers = layers
        self.rank, self.world_size = dist.rank(), dist.world_size()
        self.decode = TokenDecoder(tokenizer)
        self._meta = self._make_meta(config, info, model, tokenizer)
        self._writer: RunWriter | None = None
        self._on_error, self._compact_every = output.on_error, output.compact_every
        self._upload_wait = output.upload_wait
        self._resume_step = resume_step
        self._trackers = list(output.trackers) if self.rank == 0 else []
        self._step: StepRecorder | None = None
        self.last_step: int | None = None
        self._floor: int | None = None  # the last step already on disk when opened: new steps come after it
        self._last_seq: int | None = None
        self._lock: claim.Claim | None = None
        self.doctor = as_doctor(doctor) if self.rank == 0 else None
        # every rank: DDP ranks read the same all-reduced norm, so they flag the same spikes
        self.spike_watch = SpikeWatch() if self.attribution.on_spike and model is not None else None
        self.live_doctor = None  # tokengrad.doctor.live.LiveDoctor while open with a doctor
        self.agreement: RankAgreement | None = None  # the ranks' side group, made at open (a collective)

    # With Doctor(halt=True): begin_step raises DoctorHalt (a plain loop). An integration that stops its
    # trainer itself (TRL's should_training_stop) sets this False and reads `halt_finding` at step ends.
    raise_on_halt = True

    @property
    def halt_finding(self):
        """The live doctor's critical finding that asks for a stop (Doctor(halt=True)), or None."""
        return None if self.live_doctor is None else self.live_doctor.halt

    # The recorder's settings as the step recorder reads them.
    bucket_every = property(lambda self: self.buckets.every)
    bucket_edges = property(lambda self: self.buckets.edges)
    attribute_every = property(lambda self: self.attribution.every)
    attribute_method = property(lambda self: self.attribution.method)
    attribute_eps = property(lambda self: self.attribution.eps)
    attribute_applied = property(lambda self: self.attribution.applied)

    # ---- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._step is not None and exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
                self.discard_step()  # Ctrl-C / SIGTERM: the step in flight did not happen
            elif self._step is not None:  # a step that failed is still recorded as far as it got
                self.end_step()
        finally:
            self.close(finished=exc_type is None)  # a run that ended in an error is not finished

    def open(self) -> "Recorder":
        if self._writer is not None:
            raise RuntimeError("Recorder is already open")
        refuse_sharding(
            self.model,
            buckets=self.buckets.every,
            attribution=self.attribution.every,
            on_spike=self.attribution.on_spike,
        )
        if self.doctor is not None:  # first: an unknown detector name fails before anything is written
            from tokengrad.doctor.live import LiveDoctor  # pandas/DuckDB/scipy: loaded only when asked for

            self.live_doctor = LiveDoctor(self.run_dir, self.doctor, self._trackers)
        # The directory's claim first (one process, one Recorder per rank), then what it holds.
        self._lock = claim.adopt(self.run_dir, self.rank, self)
        try:
            if self.bucket is not None:  # the bucket's claim, resume from it, the uploader
                self.bucket.open(self.rank)
            old = self._claim()
            carried = self._carried_rows_dropped(old)
            self._writer = RunWriter(
                self.run_dir,
                self.rank,
                on_error=self._on_error,
                compact_every=self._compact_every,
                rows_dropped=carried,
            )
            self._last_seq = None  # a sequence number of the writer of an earlier open(): not this one's
            if self.rank == 0:
                self._write_meta(finished=False)
        except BaseException:  # a failed open leaves no claim and no writer thread behind
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            if self.bucket is not None and self.bucket.claim is not None:
                self.bucket.close(0.0)
            self._lock.release()
            raise
        self.agreement = RankAgreement.create() if self.model is not None else None
        self._floor = self._last_recorded_step() if self._resume_step is None else self._resume_step - 1
        if self._resume_step is not None:
            removed = self._writer.drop_steps_from(self._resume_step)
            if removed:
                warnings.warn(
                    f"tokengrad: resuming at step {self._resume_step}: removed {removed} rows recorded "
                    f"after the checkpoint from {self.run_dir}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return self

    def close(self, finished: bool = True) -> None:
        """Commit what is queued, merge small files, write the rank status and meta.json. A disk that is
        full or read-only only costs a warning with the exact number of rows lost (with on_error="raise"
        the writer's error is raised after the status is written)."""
        if self._writer is None:
            return
        try:
            self._writer.close()
        finally:
            if self.live_doctor is not None:  # the final state, diagnosed before the trackers close
                self.live_doctor.close(self.last_step)
            for tracker in self._trackers:
                tracker.close()
            left = self.bucket.drain(self._upload_wait) if self.bucket else None
            saved = self._write_status(finished=finished, not_uploaded=left)
            if self.rank == 0:
                saved = self._write_meta(finished=finished) and saved
            dropped = dict(self._writer.rows_dropped)
            if sum(dropped.values()):
                where = "see meta.json rows_dropped" if saved else "the count could not be saved either"
                warnings.warn(
                    f"tokengrad: {sum(dropped.values())} rows could not be written to {self.run_dir} "
                    f"(by table: {dropped}; {where})",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self._writer = None
            if self.bucket is not None:  # the status and meta.json too, then the claim
                self.bucket.close(self._upload_wait)
            self._lock.release()

    def flush(self) -> None:
        """Wait until every finished step is on disk."""
        self._require_open().flush()

    def checkpoint_step(self) -> int | None:
        """The barrier before a checkpoint: waits until every finished step is committed (or its rows are
        counted as dropped) and returns the last such step, which the checkpoint then implies is on disk."""
        self._require_open().flush()
        return self.last_step

    # ---- steps ------------------------------------------------------------------------------------
    def step(self, step: int) -> StepRecorder:
        """Context manager for one training step: `with rec.step(i) as st: ...`."""
        return self.begin_step(step)

    def begin_step(self, step: int) -> StepRecorder:
        self._require_open()
        if self._step is not None:
            raise RuntimeError(f"step {self._step.step} is still open; end it before beginning step {step}")
        if self.raise_on_halt and self.halt_finding is not None:
            raise DoctorHalt(self.halt_finding)
        step = self._check_step(step)
        bucket = self.bucket_every > 0 and step % self.bucket_every == 0
        attribute = self.attribute_every > 0 and step % self.attribute_every == 0
        whatif = self.whatif.every > 0 and step % self.whatif.every == 0
        self._step = StepRecorder(self, step, bucket, attribute, whatif)
        return self._step

    def _check_step(self, step) -> int:
        """An int in 0..2**31-1, after every step recorded so far (the reader relies on steps increasing)."""
        try:
            step = operator.index(step)
        except TypeError:
            raise ValueError(f"step must be an integer, got {type(step).__name__} {step!r}") from None
        if not 0 <= step <= MAX_STEP:
            raise ValueError(f"step {step} is out of range 0..{MAX_STEP} (the step column is int32)")
        before = self.last_step if self.last_step is not None else self._floor
        if before is not None and step <= before:
            raise ValueError(
                f"step {step} does not come after step {before}, already recorded in {self.run_dir}: each "
                "step is recorded once, in increasing order (to record it again, open the Recorder with "
                f"resume_step={step}, which removes the rows of steps >= {step} first)"
            )
        return step

    def end_step(self) -> None:
        st, self._step = self._step, None
        if st is None:
            raise RuntimeError("no step is open")
        halt_now = self._halts_on(st)
        bundle = st.finish()
        for tracker in self._trackers:  # published on the writer thread once the tables are built
            bundle = tracker.tee(bundle)
        writer = self._require_open()
        # At most one finished step is ever waiting for the writer: before handing over step k, step k-1
        # must be on disk (normally long done), so a crash loses at most the step in flight and the one
        # being written, while writing still overlaps with the next step's compute.
        before = self.last_step
        if self._last_seq is not None:
            writer.wait_for(self._last_seq)
            if self.live_doctor is not None and before is not None:  # step `before` is on disk now
                self.live_doctor.committed(before)
        self._last_seq = writer.submit(bundle)
        self.last_step = st.step
        if halt_now:  # diagnosed on disk now, so the next begin_step raises DoctorHalt (no step lost)
            writer.wait_for(self._last_seq)
            self.live_doctor.committed(st.step)
            self.live_doctor.drain(self.live_doctor.options.close_timeout)
        if self._on_error == "raise":  # the error belongs to this step, not the next one
            writer.wait_for(self._last_seq)

    def _halts_on(self, st) -> bool:
        """A step with a NaN/inf loss or gradient norm under Doctor(halt=True)."""
        doctor = self.live_doctor
        return doctor is not None and doctor.options.halt and st.host.nonfinite()

    def discard_step(self) -> None:
        """Drop the open step without recording it (an interrupted step: a resume runs it again)."""
        st, self._step = self._step, None
        if st is None:
            raise RuntimeError("no step is open")
        st.discard()

    @property
    def on_error(self) -> str:
        """ "count" or "raise": what a writer failure does (the trainer's checkpoints follow it)."""
        return self._on_error

    @property
    def current_step(self) -> StepRecorder | None:
        return self._step

    def log_eval(self, step: int, task: str, difficulty, accuracy: float, n: int) -> None:
        """One evaluation result (e.g. K&K accuracy for 3 people) into the evals table."""
        row = dict(
            step=int(step),
            rank=self.rank,
            task=str(task),
            difficulty=str(difficulty),
            accuracy=float(accuracy),
            n=int(n),
        )
        bundle = {"evals": Rows(lambda: scalar_table("evals", [row]), 1)}
        for tracker in self._trackers:
            bundle = tracker.tee(bundle)
        self._require_open().submit(bundle)

    # ---- meta -------------------------------------------------------------------------------------
    @property
    def meta(self) -> dict:
        """A copy of what meta.json holds for this run (config, weighting, temperature, ...)."""
        return dict(self._meta)

    def _make_meta(self, config, info: RunInfo, model, tokenizer) -> dict:
        return run_meta.make_meta(
            self.run_dir,
            config=config,
            info=info,
            model=model,
            tokenizer=tokenizer,
            world_size=self.world_size,
            buckets=self.buckets,
            attribution=self.attribution,
            budget=self.budget,
            whatif=self.whatif,
        )

    def _claim(self) -> dict | None:
        resuming = self._resume_step is not None
        run_meta.refuse_rows_without_meta(self.run_dir, self.rank, resuming)
        return run_meta.check_claim(self.run_dir, self._meta, resuming=resuming)

    def _carried_rows_dropped(self, old_meta: dict | None) -> dict[str, int]:
        return run_meta.carried_rows_dropped(self.run_dir, self.rank, old_meta)

    def _last_recorded_step(self) -> int | None:
        """The highest step this rank has in the steps table already (a re-opened run continues after it)."""
        folder = self.run_dir / schema.rank_dir("steps", self.rank)
        ranges = [layout.step_range(p) for _, _, p in layout.entries(folder)]
        return max((r[1] for r in ranges if r), default=None)

    def _write_meta(self, finished: bool) -> bool:
        dropped = dict(self._writer.rows_dropped) if self._writer else {}
        return run_meta.write_meta(self.run_dir, self._meta, finished, dropped)

    def _write_status(self, finished: bool, not_uploaded: int | None = None) -> bool:
        last = self.last_step if self.last_step is not None else self._floor
        upload = None if self.bucket is None else self.bucket.status(not_uploaded or 0)
        return run_meta.write_status(self.run_dir, self.rank, finished, last, self._writer, upload=upload)

    def _require_open(self) -> RunWriter:
        if self._writer is None:
            raise RuntimeError("Recorder is not open: use `with Recorder(...) as rec:` or call rec.open()")
        return self._writer
