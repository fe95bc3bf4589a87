"""Input checks where tensors enter the recorder: a ValueError names the tensor, its shape and what was
expected, before anything is recorded (so a bad call never corrupts a step already in progress)."""

from __future__ import annotations

import operator

import torch

from tokengrad import schema
from tokengrad.record.token_text import safe_text

MAX_ID = 2**31 - 1  # token_id is an int32 column
# st.log() / st.samples() names the recorder fills itself
RESERVED = frozenset({"step", "rank"})


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
        "is_weights",
        "mask_codes",
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
        if name in ("token_ids", "sample_ids", "group_ids") and (t.is_floating_point() or t.is_complex()):
            raise ValueError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    builtin = set(schema.column_names("tokens"))
    for name, t in (tensors.get("extra") or {}).items():
        if name in builtin:
            raise ValueError(f"extra column {name!r} has the name of a built-in tokens column; rename it")
        if not torch.is_tensor(t) or _shape(t) != (N, T):
            raise ValueError(
                f"extra column {name!r} must be a [N, T] = {(N, T)} tensor, got {getattr(t, 'shape', t)}"
            )
    return N, T


def check_ids(
    token_ids: torch.Tensor, mask: torch.Tensor, vocab_size: int | None, sample_ids: torch.Tensor
) -> None:
    """Recorded token ids lie in [0, vocab_size) (or fit int32 when the vocabulary is unknown) and the
    sample ids of a pass are distinct (a repeated id would merge two sequences' tokens)."""
    ids = token_ids[mask]
    if ids.numel():
        lo, hi = (int(v) for v in torch.aminmax(ids))
        top = (vocab_size or MAX_ID + 1) - 1
        if lo < 0 or hi > top:
            bad = lo if lo < 0 else hi
            where = f"the vocabulary of {vocab_size} tokens" if vocab_size else "the int32 token_id column"
            raise ValueError(f"token_ids holds {bad}, outside 0..{top} ({where})")
    if sample_ids.numel() != torch.unique(sample_ids).numel():
        raise ValueError(
            f"sample_ids repeat within one tracked pass: {sample_ids.tolist()}; each row of "
            "logprobs is one sequence and needs its own id"
        )


def check_scalars(scalars: dict, numeric: set[str]) -> dict:
    """st.log() values as plain Python: numbers (or one-element tensors), str, bool or None; the built-in
    columns in `numeric` must be numbers. A ValueError names the key and the value."""
    out = {}
    for k, v in scalars.items():
        if k in RESERVED:
            raise ValueError(f"st.log(): {k!r} is set by the recorder; use another name")
        if torch.is_tensor(v):
            if v.numel() != 1:
                raise ValueError(f"st.log(): {k!r} must be a scalar, got a tensor of shape {tuple(v.shape)}")
            v = v.item()
        elif hasattr(v, "item") and not isinstance(v, (str, bytes)):  # numpy scalars
            v = v.item()
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = float(v)
        elif v is not None and not isinstance(v, (str, bool)):
            raise ValueError(f"st.log(): {k!r} = {v!r} is a {type(v).__name__}; log numbers, text or bools")
        if isinstance(v, str):
            v = safe_text(v, f"st.log(): {k!r}")
        if k in numeric and not (v is None or isinstance(v, float)):
            raise ValueError(f"st.log(): {k!r} is a numeric column, got {type(v).__name__} {v!r}")
        out[k] = v
    return out


def safe_texts(value, where: str):
    """A samples() column with each string made storable (see safe_text); other values as they are."""
    if isinstance(value, str):
        return safe_text(value, where)
    if isinstance(value, (list, tuple)) or getattr(getattr(value, "dtype", None), "kind", "") in ("O", "U"):
        return [safe_text(v, where) if isinstance(v, str) else v for v in value]
    return value


def as_ids(ids: torch.Tensor | None, n: int, dev) -> torch.Tensor:
    """[n] row ids as given, or 0..n-1."""
    return torch.arange(n, device=dev) if ids is None else torch.as_tensor(ids, device=dev).long()


def every_steps(name: str, value) -> int:
    """A step interval: an int >= 0 (0 = never). A string or float is refused, not parsed."""
    try:
        every = operator.index(value)
    except TypeError:
        raise ValueError(
            f"{name} must be an integer >= 0 (0 = never), got {type(value).__name__} {value!r}"
        ) from None
    if isinstance(value, bool) or every < 0:
        raise ValueError(f"{name} must be an integer >= 0 (0 = never), got {value!r}")
    return every
