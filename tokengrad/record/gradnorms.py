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


def _accepts(names: NamesFilter) -> Callable[[str], bool]:
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
    with_grad = [(n, p.grad) for n, p in named_params if p.grad is not None]
    if not with_grad:
        return 0.0, {}
    norms = torch._foreach_norm([g.float() if g.dtype != torch.float32 else g for _, g in with_grad])
    sq = torch.stack(norms).double().pow(2).tolist()  # [P] one sync, then plain floats
    keep = _accepts(names)
    blocks: dict[str, float] = {}
    for (n, _), s in zip(with_grad, sq):
        b = block_name(n)
        if keep(b):
            blocks[b] = blocks.get(b, 0.0) + s
    return math.sqrt(sum(sq)), {b: math.sqrt(v) for b, v in blocks.items()}
