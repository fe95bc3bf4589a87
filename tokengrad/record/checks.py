"""Input checks where tensors enter the recorder: a ValueError names the tensor, its shape and what was
expected, before anything is recorded (so a bad call never corrupts a step already in progress)."""

from __future__ import annotations

import torch


def _shape(t) -> tuple:
    return tuple(t.shape)


def check_track_inputs(logprobs: torch.Tensor, **tensors) -> tuple[int, int]:
    """Validate st.track() arguments; returns (N, T)."""
    if not torch.is_tensor(logprobs) or logprobs.dim() != 2 or not logprobs.is_floating_point():
        raise ValueError(
            f"logprobs must be a float [N, T] tensor, got "
            f"{type(logprobs).__name__} {getattr(logprobs, 'shape', '')} {getattr(logprobs, 'dtype', '')}"
        )
    N, T = logprobs.shape
    dev = logprobs.device
    nt = {
        "token_ids",
        "mask",
        "loss_mask",
        "old_logprobs",
        "ref_logprobs",
        "rollout_logprobs",
        "weights",
        "scale_grad",
        "clipped",
    }
    for name, t in tensors.items():
        if t is None or name == "extra":
            continue
        if not torch.is_tensor(t):
            if name in ("sample_ids", "group_ids"):
                t = torch.as_tensor(t)
            else:
                raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but logprobs is on {dev}")
        if name in nt and _shape(t) != (N, T):
            raise ValueError(f"{name} has shape {_shape(t)}, expected [N, T] = {(N, T)} like logprobs")
        if name == "advantages" and _shape(t) not in ((N,), (N, T)):
            raise ValueError(f"advantages has shape {_shape(t)}, expected [N] = {(N,)} or [N, T] = {(N, T)}")
        if name in ("sample_ids", "group_ids") and _shape(t) != (N,):
            raise ValueError(f"{name} has shape {_shape(t)}, expected [N] = {(N,)}")
        if name == "logits" and (t.dim() != 3 or _shape(t)[:2] != (N, T)):
            raise ValueError(f"logits has shape {_shape(t)}, expected [N, T, V] with [N, T] = {(N, T)}")
        if name == "hidden" and (t.dim() != 3 or _shape(t)[:2] != (N, T)):
            raise ValueError(f"hidden has shape {_shape(t)}, expected [N, T, D] with [N, T] = {(N, T)}")
        if name == "token_ids" and t.is_floating_point():
            raise ValueError(f"token_ids must be an integer tensor, got dtype {t.dtype}")
    for name, t in (tensors.get("extra") or {}).items():
        if not torch.is_tensor(t) or _shape(t) != (N, T):
            raise ValueError(
                f"extra column {name!r} must be a [N, T] = {(N, T)} tensor, got {getattr(t, 'shape', t)}"
            )
    return N, T
