"""Facts about a run spread over processes (torchrun, accelerate launch; DDP or FSDP), and the collective
operations the recorder needs. The built-in trainer's launch plumbing lives in `tokengrad.train.distributed`.

    from tokengrad.record import distributed as dist
    dist.rank(), dist.world_size(), dist.is_main()
    total = dist.all_reduce([loss_sum, n_tokens])            # summed over ranks (identity in one process)
    total, blocks = dist.global_grad_norms(model)             # the norm of the gradient the optimizer sees

Every function works without an initialised process group (a single process is rank 0 of 1), so code
written against this module runs unchanged under `python`, `torchrun` and `accelerate launch`.

Why grad norms need care: after DDP's backward every rank holds the same, already averaged gradient, so
the local norm *is* the global one and summing squares over ranks would count it `world_size` times.
FSDP instead leaves each rank a shard; there the global squared norm is the sum of the shards' squared
norms. `global_grad_norms` tells the two apart by looking at the gradients (DTensor shards, FSDP's flat
parameters) rather than at a user flag.
"""

from __future__ import annotations

import os

import torch

from tokengrad.record.gradnorms import NamesFilter, block_name, name_filter, trainable_params


def group_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    """Global rank: from the process group if initialised, else $RANK (set by torchrun/accelerate), else 0."""
    if group_ready():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    """Number of processes: from the process group if initialised, else $WORLD_SIZE, else 1."""
    if group_ready():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    """Rank within the node ($LOCAL_RANK, else 0): which accelerator this process uses."""
    return int(os.environ.get("LOCAL_RANK", 0))


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if group_ready() and world_size() > 1:
        torch.distributed.barrier()


def collective_device() -> torch.device:
    """NCCL only reduces accelerator tensors; gloo (CPU) reduces CPU tensors."""
    if group_ready() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce(values, op: str = "sum") -> torch.Tensor:
    """Reduce a list of floats (or a 1-D tensor) over ranks; returns a float64 CPU tensor.

    op: "sum", "max" or "min". Without a process group the values come back unchanged.
    """
    ops = {"sum": "SUM", "max": "MAX", "min": "MIN"}
    if op not in ops:
        raise ValueError(f"unknown reduce op {op!r}; known ops: {sorted(ops)}")
    t = torch.as_tensor(values, dtype=torch.float64).reshape(-1)  # [K]
    if not group_ready() or world_size() == 1:
        return t
    t = t.to(collective_device())
    torch.distributed.all_reduce(t, op=getattr(torch.distributed.ReduceOp, ops[op]))
    return t.cpu()


def grads_are_sharded(model: torch.nn.Module) -> bool:
    """True when each rank holds only a shard of the gradient (FSDP1 flat parameters, FSDP2/DTensor)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch builds without distributed support
        return False
    for name, p in model.named_parameters():
        if isinstance(p, DTensor) or isinstance(p.grad, DTensor) or "_fsdp_wrapped_module" in name:
            return True
        if type(p).__name__ == "FlatParameter":
            return True
    return False


@torch.no_grad()
def global_grad_norms(model: torch.nn.Module, names: NamesFilter = None) -> tuple[float, dict[str, float]]:
    """(total, {block: norm}) of the gradient the optimizer will apply, identical on every rank.

    Replicated gradients (DDP, one process) are read locally; sharded ones (FSDP) have their squared
    norms summed over ranks. Blocks are named as `tokengrad.record.gradnorms.block_name` names them.
    """
    from torch.distributed.tensor import DTensor

    sq: dict[str, float] = {}
    for name, p in trainable_params(model):
        g = p.grad
        if g is None:
            continue
        g = g.to_local() if isinstance(g, DTensor) else g
        b = block_name(name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", ""))
        sq[b] = sq.get(b, 0.0) + float(g.float().pow(2).sum())
    blocks = sorted(sq)
    local = [sq[b] for b in blocks]
    if grads_are_sharded(model):
        # blocks missing on one rank must still line up: agree on the union of names first
        blocks = _union_names(blocks)
        local = [sq.get(b, 0.0) for b in blocks]
        local = all_reduce(local).tolist()
    total = sum(local) ** 0.5
    wanted = name_filter(names)
    return total, {b: v**0.5 for b, v in zip(blocks, local) if wanted(b)}


def _union_names(names: list[str]) -> list[str]:
    if not group_ready() or world_size() == 1:
        return names
    gathered: list = [None] * world_size()
    torch.distributed.all_gather_object(gathered, names)
    return sorted({n for part in gathered for n in part})
