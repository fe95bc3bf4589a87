"""One tracked backward pass while its step is open: the log-probs with their graph, the detached value
columns, masks and ids, and the coef the autograd hook fills in (tensors stay on their device until the
step ends); `build_pass` makes one from st.track()'s arguments (`PassInputs`, by name)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from tokengrad.record.checks import as_ids, check_ids, check_track_inputs
from tokengrad.record.stats import TokenStats, pass_values


@dataclass(kw_only=True)
class TrackedPass:
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
    recompute: object = None  # () -> [N, T] log pi again, for attribution (and on-spike) steps
    policy_versions: torch.Tensor | None = None  # [N] float64, NaN: unknown (tokens.policy_version)
    trainer_version: int | None = None  # tokens.trainer_version of every row

    def watch_coef(self, paused: Callable[[], bool], loss_scale: Callable[[], float] = lambda: 1.0) -> None:
        """Register the autograd hook on `logprobs` that reads coef = dL/d log pi per token in each backward
        (summed over backwards, times `scale` where given, which the hook also applies to the gradient).
        `paused()`: a backward whose gradient is not the loss's is running (the bucket passes feed coef
        back in), which the hook leaves alone. `loss_scale()`: the factor the backward's loss carries (an
        fp16 gradient scaler's), which the recorded coef is divided by (the gradient keeps it)."""
        if not self.logprobs.requires_grad:
            warnings.warn(  # stacklevel 3: the caller of st.track
                "tokengrad: tracked logprobs do not require grad; coef will be missing",
                RuntimeWarning,
                stacklevel=3,
            )
            return

        def hook(grad: torch.Tensor):
            if paused():
                return None
            g = grad if self.scale is None else grad * self.scale  # [N, T]
            c, divisor = g.detach(), loss_scale()
            if divisor != 1.0:  # a power of two from a gradient scaler: the division is exact
                c = c / divisor
            self.coef = c.clone() if self.coef is None else self.coef + c
            return None if self.scale is None else g

        self.handle = self.logprobs.register_hook(hook)

    def unwatch_coef(self) -> None:
        """Remove the coef hook (at the end of the step, or when it is dropped)."""
        if self.handle is not None:
            self.handle.remove()


@dataclass(frozen=True, kw_only=True)
class PassInputs:
    """st.track()'s keyword arguments as given, by name: what build_pass checks and records of one pass.
    Their shapes are commented here; what each means and the tokens columns it fills: docs/api.md,
    "st.track(logprobs, ...)" (the one reference). st.track's own `update_id` and `recompute` are not
    inputs of the pass's rows and are passed to build_pass apart."""

    token_ids: torch.Tensor  # [N, T]
    mask: torch.Tensor | None = None  # [N, T]
    loss_mask: torch.Tensor | None = None  # [N, T]
    old_logprobs: torch.Tensor | None = None  # [N, T]
    ref_logprobs: torch.Tensor | None = None  # [N, T]
    rollout_logprobs: torch.Tensor | None = None  # [N, T]
    is_weights: torch.Tensor | None = None  # [N, T]
    mask_codes: torch.Tensor | None = None  # [N, T]
    advantages: torch.Tensor | None = None  # [N] or [N, T]
    weights: torch.Tensor | None = None  # [N, T]
    scale_grad: torch.Tensor | None = None  # [N, T]
    sample_ids: torch.Tensor | None = None  # [N]
    group_ids: torch.Tensor | None = None  # [N]
    logits: torch.Tensor | None = None  # [N, T, V]
    stats: TokenStats | None = None
    hidden: torch.Tensor | None = None  # [N, T, D]
    clipped: torch.Tensor | None = None  # [N, T]
    policy_versions: torch.Tensor | int | None = None  # [N] or one int
    trainer_version: int | None = None
    extra: dict[str, torch.Tensor] | None = None  # name -> [N, T]

    def tensors(self) -> dict:
        """The arguments check_track_inputs validates (shape, device, dtype), by name: all but the
        statistics and the version numbers, which have checks of their own."""
        skip = ("stats", "policy_versions", "trainer_version")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


# st.track()'s host-trainer tensors and the tokens columns they fill
_HOST_COLUMNS = {"rollout_logprob": "rollout_logprobs", "is_weight": "is_weights", "mask_code": "mask_codes"}


def build_pass(
    pass_id: int, logprobs: torch.Tensor, inputs: PassInputs, *, update_id: int = 0, recompute=None
) -> TrackedPass:
    """Pass `pass_id` of the step from st.track()'s arguments, after checking every shape, device and id:
    the masks as bool, the detached value columns (record/stats.py) and the host trainer's own per-token
    tensors. `update_id`: the optimizer update it feeds; `recompute`: kept for attribution."""
    N, T = check_track_inputs(logprobs, **inputs.tensors())
    dev = logprobs.device
    mask = (
        torch.ones(N, T, dtype=torch.bool, device=dev) if inputs.mask is None else inputs.mask.to(torch.bool)
    )
    # a model's vocabulary may be larger than its tokenizer's, so only logits give the bound
    vocab = inputs.logits.shape[-1] if inputs.logits is not None else None
    sample_ids, group_ids = as_ids(inputs.sample_ids, N, dev), as_ids(inputs.group_ids, N, dev)
    check_ids(inputs.token_ids, mask, vocab, sample_ids)
    in_loss = mask if inputs.loss_mask is None else (inputs.loss_mask.to(torch.bool) & mask)
    tensors = pass_values(
        logprobs,
        token_ids=inputs.token_ids,
        mask=mask,
        old=inputs.old_logprobs,
        ref=inputs.ref_logprobs,
        adv=inputs.advantages,
        weights=inputs.weights,
        logits=inputs.logits,
        stats=inputs.stats,
        hidden=inputs.hidden,
    )
    host = {col: getattr(inputs, name) for col, name in _HOST_COLUMNS.items()}
    tensors.update({col: t.detach().float() for col, t in host.items() if t is not None})
    policy_versions, trainer_version = check_versions(inputs.policy_versions, inputs.trainer_version, N)
    return TrackedPass(
        pass_id=pass_id,
        update_id=update_id,
        logprobs=logprobs,
        tensors=tensors,
        token_ids=inputs.token_ids.detach(),
        mask=mask,
        in_loss=in_loss,
        sample_ids=sample_ids,
        group_ids=group_ids,
        scale=None if inputs.scale_grad is None else inputs.scale_grad.detach().to(logprobs.dtype),
        clipped=None if inputs.clipped is None else inputs.clipped.detach().to(torch.bool),
        extra={k: v.detach() for k, v in (inputs.extra or {}).items()},
        recompute=recompute,
        policy_versions=policy_versions,
        trainer_version=trainer_version,
    )


def check_versions(policy_versions, trainer_version, n: int) -> tuple[torch.Tensor | None, int | None]:
    """st.track's version arguments: `policy_versions` an int (every row) or [N] numbers (NaN or None:
    unknown), `trainer_version` an int; ([N] float64 on the CPU or None, int or None)."""
    if trainer_version is not None and not (_is_int(trainer_version) and int(trainer_version) >= 0):
        raise ValueError(f"trainer_version must be an int >= 0, got {trainer_version!r}")
    if policy_versions is None:
        return None, None if trainer_version is None else int(trainer_version)
    if _is_int(policy_versions):
        v = torch.full((n,), float(policy_versions), dtype=torch.float64)  # [N]
    elif isinstance(policy_versions, (bool, float, str)):
        raise ValueError(f"policy_versions must be an int or [N] whole numbers, got {policy_versions!r}")
    else:
        if not torch.is_tensor(policy_versions):
            policy_versions = torch.tensor(
                [float("nan") if x is None else float(x) for x in policy_versions], dtype=torch.float64
            )
        v = policy_versions.detach().to("cpu", torch.float64).reshape(-1)  # [N]
        if v.numel() != n:
            raise ValueError(f"policy_versions has {v.numel()} entries, expected [N] = ({n},)")
    known = v[~torch.isnan(v)]
    if bool((known != known.round()).any()) or bool((known < 0).any()):
        raise ValueError("policy_versions must be whole numbers >= 0 (NaN or None: unknown)")
    return v, None if trainer_version is None else int(trainer_version)


def _is_int(x) -> bool:
    if isinstance(x, bool):
        return False
    return isinstance(x, int) or (torch.is_tensor(x) and x.dim() == 0 and not x.is_floating_point())
