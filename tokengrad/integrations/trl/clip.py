"""Gradient norms before clipping on a TRL recording, and the clip that reuses them.

TRL clips through `accelerator.clip_grad_norm_` once per optimizer update; the hook reads the total and
per-block norms there, before clipping changes `.grad` (TRL's logged `grad_norm` is the same number).
Where accelerate's clip is torch's clip alone (one process or DDP, the model's own parameters, L2), it
clips with the norm just read instead of reading `.grad` a second time, leaving the gradients bitwise as
torch's clip does (`st.host.clip_recorded_`). Under fp16 with a gradient scaler accelerate unscales
first; the hook unscales, then reads, so the norms are the true ones (and coef is read unscaled:
`loss_scale`, recording.py). A trainer that clips some other
way gets its norms at `on_pre_optimizer_step`, after clipping, with a warning. Under DeepSpeed the norms
come through DeepSpeed's API instead (deepspeed.py); both readers share the recording's `_norms_done`.
"""

from __future__ import annotations

import warnings

# accelerate's distributed types whose clip_grad_norm_ is torch's clip on the local .grad (DDP: reduced)
PLAIN_CLIP = (
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "MULTI_XPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
)


class ClipNorms:
    """Reads the norms before clipping for one TRL recording (installed by TRLRecording): patches
    `accelerator.clip_grad_norm_` (restored on detach) and backs it up before each optimizer step."""

    def __init__(self, recording):
        self.recording = recording

    def install(self) -> None:
        self.recording._patch(self.recording.trainer.accelerator, "clip_grad_norm_", self._clip_grad_norm)

    def _clip_grad_norm(self, orig, parameters, max_norm, norm_type=2, **k):
        """Norms before clipping; where accelerate would only call torch's clip, clip with the norm just
        read instead of reading .grad again (bitwise torch's: st.host.clip_recorded_). With an fp16
        gradient scaler the gradients are unscaled first, as accelerate's clip does, so the norms read
        are the true ones; accelerate's own clip then runs without unscaling a second time."""
        rec = self.recording
        accelerator = rec.trainer.accelerator
        parameters = list(parameters)
        fresh = rec.step is not None and not rec._norms_done
        scaled = fresh and loss_scale(accelerator) is not None
        if scaled:
            accelerator.unscale_gradients()
        self.record()  # before clipping changes .grad
        if fresh and not k and plain_clip(accelerator, rec.recorder.model, parameters, norm_type):
            return rec.step.host.clip_recorded_(max_norm, rec.update_id)
        if scaled:
            return _without_unscaling(accelerator, lambda: orig(parameters, max_norm, norm_type, **k))
        return orig(parameters, max_norm, norm_type, **k)

    def record(self) -> None:
        """The norms of this optimizer update, once."""
        rec = self.recording
        if rec.step is not None and not rec._norms_done:
            rec.step.record_grad_norms(rec.update_id)
            rec._norms_done = True

    def before_optimizer_step(self) -> None:
        """The trainer's `on_pre_optimizer_step`: norms not read yet mean it clipped elsewhere, or not at
        all (`max_grad_norm` 0 or None: the Trainer skips the clip, and the norms read now are the ones
        before any clipping); read them now, after any clipping, and say so where a clip was asked for."""
        rec = self.recording
        if rec.step is None or rec._norms_done:
            return
        if (getattr(rec.trainer.args, "max_grad_norm", None) or 0) > 0:
            warnings.warn(
                "tokengrad: the trainer clipped gradients without accelerator.clip_grad_norm_; "
                "gradient norms are read after clipping",
                RuntimeWarning,
                stacklevel=2,  # the trainer callback's on_pre_optimizer_step
            )
        self.record()


def _without_unscaling(accelerator, clip):
    """Run accelerate's clip with its first step, unscale_gradients(), already done (a second unscale_ of
    the same gradients is an error in torch's GradScaler)."""
    accelerator.unscale_gradients = lambda *a, **k: None  # an instance attribute over the method
    try:
        return clip()
    finally:
        del accelerator.unscale_gradients


def loss_scale(accelerator) -> float | None:
    """The factor accelerate's backward multiplies the loss by: an fp16 gradient scaler's scale, or None
    (no scaler)."""
    scaler = getattr(accelerator, "scaler", None)
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None


def plain_clip(accelerator, model, parameters: list, norm_type) -> bool:
    """accelerate's clip_grad_norm_ is unscale_gradients() then torch's clip for this accelerator and
    these parameters: not FSDP, DeepSpeed or XLA, the model's own parameters (with a gradient scaler the
    caller unscales first, as accelerate would)."""
    kind = str(getattr(accelerator, "distributed_type", "")).rsplit(".", 1)[-1]
    return (
        float(norm_type) == 2.0
        and kind in PLAIN_CLIP
        and model is not None
        and len(parameters) == len(own := list(model.parameters()))
        and all(a is b for a, b in zip(parameters, own))
    )
