"""Gradient norms of a model, whole and per top-level block, read from `param.grad` before clipping.

Blocks follow `named_parameters()` dotted names as they are: the block of a parameter is its name up to
and including the first numeric component (`model.layers.12.mlp.up_proj.weight` -> `model.layers.12`),
else its owning module (`model.norm.weight` -> `model.norm`). A DDP/FSDP wrapper's `module.` prefix is
dropped so names match the unwrapped model.
"""

from __future__ import annotations

import math
from typing import Callable, Union

import torch

NamesFilter = Union[None, str, list, Callable[[str], bool]]


def block_name(param_name: str) -> str:
    parts = param_name.split(".")
    if parts and parts[0] == "module":
        parts = parts[1:]
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or parts[0]


def name_filter(names: NamesFilter) -> Callable[[str], bool]:
    if names is None:
        return lambda _: True
    if isinstance(names, str):
        return lambda n: n == names
    if callable(names):
        return names
    wanted = set(names)
    return lambda n: n in wanted


def trainable_params(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


@torch.no_grad()
def grad_norms(
    named_params: list[tuple[str, torch.nn.Parameter]], names: NamesFilter = None
) -> tuple[float, dict[str, float]]:
    """(total norm over all parameters, {block: norm}) of the current `.grad`s; missing grads count 0."""
    total, blocks, _ = grad_norms_for_clip(named_params, names)
    return total, blocks


@torch.no_grad()
def grad_norms_for_clip(
    named_params: list[tuple[str, torch.nn.Parameter]], names: NamesFilter = None
) -> tuple[float, dict[str, float], torch.Tensor | None]:
    """`grad_norms` plus the total norm exactly as `torch.nn.utils.clip_grad_norm_` computes it from the
    same per-parameter norms (one read of the gradients serves both), or None where torch's total would
    differ: gradients not all float32 on one device (torch groups them by device and dtype and takes the
    norms of other dtypes in that dtype)."""
    with_grad = [(n, p.grad) for n, p in named_params if p.grad is not None]
    if not with_grad:
        return 0.0, {}, None
    grads = [g for _, g in with_grad]
    norms = torch._foreach_norm([g.float() if g.dtype != torch.float32 else g for g in grads])  # P x []
    stacked = torch.stack(norms)  # [P]
    sq = stacked.double().pow(2).tolist()  # [P] one sync, then plain floats
    keep = name_filter(names)
    blocks: dict[str, float] = {}
    for (n, _), s in zip(with_grad, sq):
        b = block_name(n)
        if keep(b):
            blocks[b] = blocks.get(b, 0.0) + s
    same = all(g.dtype == torch.float32 and g.device == grads[0].device for g in grads)
    # torch: vector_norm(stack(_foreach_norm(grads))), for one device-and-dtype group in parameter order
    clip_total = torch.linalg.vector_norm(stacked, 2.0) if same else None
    return math.sqrt(sum(sq)), {b: math.sqrt(v) for b, v in blocks.items()}, clip_total


@torch.no_grad()
def clip_with_norm_(grads: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
    """Scale `grads` in place as `torch.nn.utils.clip_grad_norm_` does given its total norm `total` (a
    0-d tensor): by clamp(max_norm / (total + 1e-6), max=1), in float32, the same operations in the same
    order, so the result is bitwise torch's. A factor of exactly 1 leaves the gradients as they are
    (multiplying by 1.0 changes no value), which saves the write torch does."""
    if not grads:
        return
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)  # []
    if float(coef) == 1.0:
        return
    torch._foreach_mul_(grads, coef.to(grads[0].device))
