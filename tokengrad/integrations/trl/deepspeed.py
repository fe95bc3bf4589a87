"""TRL under DeepSpeed ZeRO: what `attach` records exactly, and what it refuses.

Under DeepSpeed, accelerate's `backward` runs DeepSpeed's `engine.backward` and, at the end of a
gradient-accumulation cycle, `engine.step()` (gradient reduction, clipping, optimizer step, zero_grad) in
the same call (accelerate/utils/deepspeed.py, DeepSpeedEngineWrapper.backward). With ZeRO-2/3 the
gradients are partitioned over ranks (ZeRO-3 also the parameters), so `.grad` read after that call is
empty or a shard, and `accelerator.clip_grad_norm_` only returns DeepSpeed's global norm.

What stays exact, and how it is read:
- token columns and coef: the autograd hook on TRL's per-token log-probs sees the gradient of the loss
  DeepSpeed backpropagates (its 1/gradient_accumulation_steps scaling included, as accelerate applies it
  without DeepSpeed). fp16 is refused: DeepSpeed multiplies the loss by its dynamic loss scale first.
- per-block and total gradient norms before clipping: `deepspeed.utils.safe_get_full_grad` on every
  parameter, called on all ranks inside `engine.step()` at the accumulation boundary, after DeepSpeed has
  reduced the gradients and before it clips them (the window its docs name: after backward, before step).
- `ds_grad_norm`: DeepSpeed's own global norm, `engine.get_global_grad_norm()` after the step.
Bucket analysis is refused: its extra backward passes need the full per-parameter gradient of each
bucket next to the total gradient, which DeepSpeed's step clears inside the same `backward` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from tokengrad.record.gradnorms import grad_norms


@dataclass(frozen=True)
class DeepSpeedSetup:
    zero_stage: int
    fp16: bool
    config: dict


def deepspeed_setup(trainer) -> DeepSpeedSetup | None:
    """The trainer's DeepSpeed configuration (accelerate's DeepSpeedPlugin), or None without DeepSpeed."""
    acc = getattr(trainer, "accelerator", None)
    plugin = getattr(getattr(acc, "state", None), "deepspeed_plugin", None)
    if plugin is None:
        return None
    cfg = dict(plugin.deepspeed_config or {})
    stage = (cfg.get("zero_optimization") or {}).get("stage", getattr(plugin, "zero_stage", 0))
    fp16 = (cfg.get("fp16") or {}).get("enabled", False)
    return DeepSpeedSetup(int(stage), fp16 is True or str(fp16).lower() == "true", cfg)


def check_deepspeed(setup: DeepSpeedSetup | None, bucket_every: int) -> None:
    """Refuse what cannot be recorded exactly under this DeepSpeed setup, with the reason."""
    if setup is None:
        return
    if bucket_every:
        raise ValueError(
            f"buckets={bucket_every}: probability-bucket analysis is not exact under DeepSpeed "
            f"(ZeRO stage {setup.zero_stage}): accelerate runs DeepSpeed's engine.step() inside backward, "
            f"which reduces, partitions and clears the gradients before the bucket passes could be compared "
            f"with them. Record with buckets=0 (token columns, coef, per-block norms through "
            f"deepspeed.utils.safe_get_full_grad and DeepSpeed's global norm stay exact), or run the "
            f"bucket analysis under DDP/FSDP."
        )
    if setup.fp16:
        raise ValueError(
            "DeepSpeed fp16 is on: DeepSpeed multiplies the loss by its dynamic loss scale before backward, "
            "so the per-token gradients tokengrad reads (coef) would carry that scale. Use bf16 "
            '("bf16": {"enabled": true}) or fp32 to record with DeepSpeed.'
        )


class DeepSpeedNorms:
    """Reads norms through DeepSpeed's API for one TRL recording (installed by TRLRecording when DeepSpeed
    is on): patches the engine's `step` (restored on detach) once accelerate has created the engine."""

    def __init__(self, recording):
        self.recording = recording
        self._engine = None

    def install(self) -> None:
        self.recording._patch(self.recording.trainer.accelerator, "backward", self._backward)

    def _backward(self, orig, loss, **kwargs):
        if self._engine is None:
            wrapped = getattr(self.recording.trainer.accelerator, "deepspeed_engine_wrapped", None)
            if wrapped is not None:
                self._engine = wrapped.engine
                self.recording._patch(self._engine, "step", self._step)
        return orig(loss, **kwargs)

    def _step(self, orig, *a, **k):
        rec, engine = self.recording, self._engine
        boundary = engine.is_gradient_accumulation_boundary()
        if boundary and rec.step is not None and not rec._norms_done:
            total, blocks = full_grad_norms(engine.module, rec.recorder.layers)
            rec.step.host.add_grad_norms(total, blocks, rec.update_id)
            rec._norms_done = True
        out = orig(*a, **k)
        if boundary and rec.step is not None:
            norm = engine.get_global_grad_norm()
            if norm is not None:
                prev = rec.step.scalars.get("ds_grad_norm")
                rec.step.log(ds_grad_norm=max(float(norm), prev if prev is not None else float("-inf")))
        return out


def full_grad_norms(module, layers=None) -> tuple[float, dict[str, float]]:
    """(total, {block: norm}) of the full, reduced gradients DeepSpeed holds for `module` (collective under
    ZeRO-3: every rank must call it)."""
    from deepspeed.utils import safe_get_full_grad

    named = [
        (n, SimpleNamespace(grad=safe_get_full_grad(p)))
        for n, p in module.named_parameters()
        if p.requires_grad
    ]
    return grad_norms(named, layers)
