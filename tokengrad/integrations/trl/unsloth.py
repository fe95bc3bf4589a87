"""Unsloth's GRPO trainer: recognised at attach() and refused, with the reason and what records instead.

Unsloth (unsloth 2026.10.9 / unsloth-zoo 2026.10.9, read for facts only; it is AGPL-3) generates a copy of
TRL's GRPOTrainer into a module of its `unsloth_compiled_cache`, names it `_UnslothGRPOTrainer` with a
subclass `UnslothGRPOTrainer`, and rebinds `trl.GRPOTrainer` to it, so an isinstance test passes. Its
compute_loss takes the log-probs from `_get_per_token_logps_and_entropies(..., compute_efficient=True)`,
which returns (None, None) there, and builds the loss in `grpo_accumulated_loss` (its own chunked LM head)
and the autograd.Function `UnslothEfficientGRPO`, both globals of the generated module. No per-token
log-probs with graph, entropy or sum_j p_j^2 ever pass through the methods attach() hooks, so attach()
refuses such a trainer; recording.py's `_refuse_untracked` stops any other trainer whose loss bypasses them.
"""

from __future__ import annotations

import sys

CLASS_NAMES = ("UnslothGRPOTrainer", "_UnslothGRPOTrainer")
CACHE_MODULE = "unsloth_compiled_cache"  # the package Unsloth writes its generated trainers into
MODULE_GLOBALS = ("UnslothEfficientGRPO", "grpo_accumulated_loss")  # the loss path of the generated module


def unsloth_markers(trainer) -> list[str]:
    """The signs of an Unsloth-generated trainer on `trainer`'s class and its bases (empty when none)."""
    found: list[str] = []
    for cls in type(trainer).__mro__:
        module = getattr(cls, "__module__", "") or ""
        if cls.__name__ in CLASS_NAMES:
            found.append(f"class {cls.__name__}")
        if CACHE_MODULE in module:
            found.append(f"module {module}")
        namespace = vars(sys.modules[module]) if module in sys.modules else {}
        found.extend(f"global {name} in {module}" for name in MODULE_GLOBALS if name in namespace)
    return list(dict.fromkeys(found))


def check_not_unsloth(trainer) -> None:
    """Refuse an Unsloth-patched GRPO trainer in one line: why nothing could be recorded, what works."""
    markers = unsloth_markers(trainer)
    if markers:
        raise ValueError(
            f"attach() cannot record Unsloth's GRPO trainer ({', '.join(markers)}): its compute_loss "
            f"builds the loss inside Unsloth's own UnslothEfficientGRPO function from log-probs it computes "
            f"itself, and its _get_per_token_logps_and_entropies returns (None, None), so no per-token "
            f"log-probs, coef or entropy reach tokengrad; record an unmodified trl.GRPOTrainer (in a process "
            f"that does not import unsloth, which rebinds trl.GRPOTrainer), or tokengrad's built-in trainer"
        )
