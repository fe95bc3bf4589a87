"""The bucket passes of a step, as a host calls them around its own backward (`st.bucket_passes`).

A plain loop never needs these: `st.backward(loss)` runs them. A host that calls `loss.backward()` itself
(TRL through accelerate, the built-in trainer's micro-batches) brackets each backward with `before_backward`
and `analyze`, and says when a scheduled analysis cannot run (`skip`) or when an update spans two steps
(`take_open`, then `carry_on` in the next step).

    passes = st.bucket_passes
    if passes.scheduled:
        passes.before_backward()
        loss.backward(retain_graph=True)
        passes.analyze(loss)
"""

from __future__ import annotations

import time

import torch

from tokengrad.record.buckets.rows import BucketState
from tokengrad.record.buckets.sharded import refuse_sharding
from tokengrad.record.distributed import grads_are_sharded
from tokengrad.record.gradnorms import trainable_params


class BucketPasses:
    """The bucket-analysis verbs of one open step (its `StepRecorder`, `step`). `scheduled`: whether this
    step analyses its buckets (on schedule and the recorder has the model)."""

    def __init__(self, step, scheduled: bool):
        self.step = step
        self.scheduled = scheduled and step.rec.model is not None

    @property
    def keeps_graph(self) -> bool:
        """The backward of this step's passes keeps their graph for the bucket or what-if passes."""
        return self.scheduled or self.step.whatif is not None

    def before_backward(self) -> None:
        """Before the backward that `analyze(loss)` follows: whether an update begins from empty gradients
        (so that one bucket can be derived as g minus the others)."""
        model = self.step.rec.model
        if self.scheduled and not grads_are_sharded(model):
            self.step.buckets.before_backward(self.step.passes, [p for _, p in trainable_params(model)])

    def analyze(self, loss: torch.Tensor | None = None) -> None:
        """After a backward that kept the graph: the what-if gradients of the passes tracked since the last
        call, then their bucket gradients (their graphs must still exist; the last pass frees them).
        `loss`, the tensor their backward ran on, lets a residual-free update skip one bucket's pass."""
        if self.step.whatif is not None:
            self._whatif()
        if not self.scheduled:
            return
        t = time.perf_counter()
        model = self.step.rec.model
        sharded = grads_are_sharded(model)
        if sharded:  # a model wrapped after the recorder opened
            refuse_sharding(model, buckets=1)
        self.step.buckets.analyze(self.step.passes, trainable_params(model), loss=loss, sharded=sharded)
        self.step.record_seconds += time.perf_counter() - t

    def _whatif(self) -> None:
        """The what-if gradients of the rules in Recorder(whatif=...) on the passes (whatif.py)."""
        st = self.step
        t = time.perf_counter()
        st.buckets.in_backward = True  # the coef hook leaves these backwards alone
        try:
            st.whatif.analyze(st.passes, trainable_params(st.rec.model), keep_graph=self.scheduled)
        finally:
            st.buckets.in_backward = False
        st.record_seconds += time.perf_counter() - t

    def skip(self) -> None:
        """No bucket analysis this step after all, though it was scheduled: under several processes the
        buckets are all-reduced, so a step in which some rank trains on no rows records none (nor what-if
        updates, all-reduced too)."""
        self.scheduled = False
        self.step.whatif = None

    def take_open(self, update_id: int) -> BucketState | None:
        """Hand over the bucket gradients of an update that has no optimizer step yet, for an update that
        spans steps (TRL accumulating over generation batches); `carry_on` on the next step."""
        return self.step.buckets.state.pop(update_id, None)

    def carry_on(self, analyze: bool, state: BucketState | None, update_id: int = 0) -> None:
        """Carry on an update begun in the previous step: its bucket analysis goes on (with the gradients
        `take_open` took) or stays off, whatever this step's own schedule says."""
        self.scheduled = analyze and self.step.rec.model is not None
        if state is not None:
            self.step.buckets.state[update_id] = state
        if self.step.whatif is not None:  # its first passes' what-if gradients were not carried
            self.step.whatif.skip_update(update_id)
