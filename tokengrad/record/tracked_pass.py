"""One tracked backward pass while its step is open: the log-probs with their graph, the detached value
columns, masks and ids, and the coef the autograd hook fills in (tensors stay on their device until the
step ends)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
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
    recompute: object = None  # () -> [N, T] log pi again, for attribution steps


def new_pass(
    index, logprobs, tensors, token_ids, mask, in_loss, ids, scale_grad, clipped, extra
) -> TrackedPass:
    """Pass number `index` of the step (update 0 until the caller says otherwise); `ids`: (sample_ids,
    group_ids), each [N]."""
    return TrackedPass(
        index,
        0,
        logprobs,
        tensors,
        token_ids.detach(),
        mask,
        in_loss,
        *ids,
        None if scale_grad is None else scale_grad.detach().to(logprobs.dtype),
        None if clipped is None else clipped.detach().to(torch.bool),
        {k: v.detach() for k, v in (extra or {}).items()},
    )
