"""The verbs a host integration calls on an open step (`st.host`), beside the five a user's loop calls.

A host that owns the backward, the clip or the gradient scaler (TRL through accelerate, DeepSpeed, the
built-in trainer) tells the step what it did there:

    st.host.set_loss_scale(scaler.get_scale())     # the next backward's loss carries this factor (fp16)
    st.host.add_grad_norms(total, blocks)           # norms read through the host's own API (ZeRO)
    st.host.clip_recorded_(max_norm)                # clip with the norms st.record_grad_norms just read
    st.host.nonfinite()                             # whether the step logged a NaN/inf loss or norm
"""

from __future__ import annotations

import math

import torch

from tokengrad import schema
from tokengrad.record.distributed import grads_are_sharded
from tokengrad.record.gradnorms import clip_with_norm_, trainable_params


class HostHooks:
    """The host verbs of one open step (its `StepRecorder`, `step`)."""

    def __init__(self, step):
        self.step = step

    def set_loss_scale(self, loss_scale: float) -> None:
        """The fp16 gradient scaler's scale the next backward's loss carries: coef is recorded divided by
        it, and the step logs it (steps.loss_scale), so that an update the scaler skips for overflow is
        not read as a non-finite model."""
        if not (isinstance(loss_scale, (int, float)) and math.isfinite(loss_scale) and loss_scale > 0):
            raise ValueError(f"loss_scale must be a finite number > 0, got {loss_scale!r}")
        self.step.loss_scale = float(loss_scale)
        self.step.scalars["loss_scale"] = self.step.loss_scale

    def add_grad_norms(self, total: float, blocks: dict[str, float], update_id: int = 0) -> None:
        """Record norms read elsewhere (e.g. through DeepSpeed's API, where `.grad` is partitioned)."""
        st = self.step
        st.update_norms[update_id] = total
        rows = [{"layer": schema.TOTAL_LAYER, "grad_norm": total}]
        rows += [{"layer": b, "grad_norm": v} for b, v in blocks.items()]
        st.layer_rows += [dict(r, step=st.step, rank=st.rec.rank, update_id=update_id) for r in rows]

    def clip_recorded_(self, max_norm: float, update_id: int = 0) -> torch.Tensor:
        """Clip the gradients of the update whose norms `st.record_grad_norms` just read, as
        `torch.nn.utils.clip_grad_norm_` would, without reading them again where torch's total norm came
        from that read (float32 gradients on one device, not sharded); returns torch's total norm."""
        model = self.step.rec.model
        grads = [p.grad for _, p in trainable_params(model) if p.grad is not None]
        clip_total = self.step.clip_totals.get(update_id)
        if clip_total is not None:
            clip_with_norm_(grads, max_norm, clip_total)
            return clip_total
        if grads_are_sharded(model):  # each rank clips its shard with the global norm
            device = grads[0].device if grads else "cpu"
            clip_total = torch.tensor(self.step.update_norms[update_id], device=device)
            clip_with_norm_(grads, max_norm, clip_total)
            return clip_total
        return torch.nn.utils.clip_grad_norm_([p for _, p in trainable_params(model)], max_norm)

    def nonfinite(self) -> bool:
        """Whether the step logged a NaN/inf loss or gradient norm: with Doctor(halt=True) the recorder then
        diagnoses the step as soon as it is on disk, so the next step boundary halts (a live diagnosis
        alone could land a step or two later)."""
        st = self.step
        values = [st.scalars.get("loss"), st.scalars.get("grad_norm"), *st.update_norms.values()]
        return any(isinstance(v, float) and not math.isfinite(v) for v in values)
