"""The built-in trainer's plumbing under torchrun / accelerate launch, on top of the recorder's process facts
(`tokengrad.record.distributed`, re-exported here so the trainer needs one `dist` name):

    from tokengrad.train import distributed as dist
    started = dist.init_from_env(device)                      # gloo on CPU, nccl on CUDA, if $WORLD_SIZE > 1
    with dist.ending(started): ...                            # ends the group it started
    mine = dist.shard(prompts_per_step, "prompts_per_step")   # this rank's slice of each step's prompts
    policy = dist.wrap(module, device)                        # DistributedDataParallel on several processes
    with dist.sync_grads(policy, last_micro_batch): ...       # accumulate locally, all-reduce once
    loss = rank_loss * dist.rank_scale(n_local)               # a global mean from per-rank means

Every function works without an initialised process group (a single process is rank 0 of 1).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable, TypeVar

import torch

from tokengrad.record.distributed import (  # noqa: F401
    all_reduce,
    barrier,
    collective_device,
    global_grad_norms,
    grads_are_sharded,
    group_ready,
    is_main,
    local_rank,
    rank,
    world_size,
)

T = TypeVar("T")


def init_from_env(device: torch.device) -> bool:
    """Join the process group that torchrun / accelerate launch describe in the environment ($WORLD_SIZE > 1,
    $MASTER_ADDR, ...) unless one exists: nccl for a CUDA device, gloo for CPU. Returns True when this call
    created it, so the caller ends it (`ending`)."""
    if world_size() == 1 or group_ready():
        return False
    if not torch.distributed.is_available():
        raise ValueError(f"WORLD_SIZE={world_size()} but this torch build has no torch.distributed")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return True


@contextlib.contextmanager
def ending(started: bool):
    """Ends the process group on leaving the block if `init_from_env` started it (started=True)."""
    try:
        yield
    finally:
        if started and group_ready():
            torch.distributed.destroy_process_group()


def process_device(name: str) -> torch.device:
    """The device this process drives for `name` = "auto", "cpu" or "cuda": under torchrun each process
    takes the accelerator of its local rank."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device = 'cuda' but torch sees no CUDA device")
    return torch.device("cuda", local_rank()) if name == "cuda" and world_size() > 1 else torch.device(name)


def shard(n: int, what: str) -> slice:
    """This rank's contiguous, equal share of n items (rank 0 the first n / world_size, and so on)."""
    ws, r = world_size(), rank()
    if n % ws:
        raise ValueError(
            f"{what} = {n} must be divisible by the number of processes ({ws}): each process "
            f"takes an equal share of whole prompt groups"
        )
    per = n // ws
    return slice(r * per, (r + 1) * per)


def wrap(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`module` in DistributedDataParallel when several processes run, else `module` itself.

    DDP broadcasts rank 0's parameters here, so every rank starts from the same weights. Buffers are not
    re-broadcast at each forward: ranks may run different numbers of forwards in one update (uneven
    micro-batches), and a collective inside every forward would then wait forever.
    """
    if not group_ready() or world_size() == 1:
        return module
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    # renamed in torch 2.13
    newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    return DistributedDataParallel(
        module, device_ids=ids, **{"forward_sync_buffers" if newer else "broadcast_buffers": False}
    )


class ModelFunction(torch.nn.Module):
    """fn(model, *args) as a module's forward, so DDP, which syncs gradients through its own forward, can
    wrap a function of the model other than model.forward; its parameters are the model's."""

    def __init__(self, fn: Callable, model: torch.nn.Module):
        super().__init__()
        self.fn, self.model = fn, model

    def forward(self, *args):
        return self.fn(self.model, *args)


def sync_grads(module: torch.nn.Module, sync: bool):
    """Context for a forward: unless `sync`, the backward of a DDP module's output keeps the gradients local
    (no_sync; DDP decides at the forward), so accumulated micro-batches are all-reduced once, by the last
    one. Other modules: no effect."""
    from torch.nn.parallel import DistributedDataParallel

    if sync or not isinstance(module, DistributedDataParallel):
        return contextlib.nullcontext()
    return module.no_sync()


def idle_backward(module: torch.nn.Module, *inputs) -> list:
    """For a rank with nothing to train in an update that other ranks train: DDP's gradient all-reduce
    needs every rank, so this one runs a forward of `inputs` and the backward of 0 x its first output,
    adding zeros to the averaged gradient. Returns [] (no loss parts)."""
    out = module(*inputs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    (out.float().sum() * 0.0).backward()
    return []


def rank_scale(local: float) -> float:
    """world_size * local / (local summed over ranks); 1 in one process (0 when the sum is 0).

    A rank's loss normalised by its own count `local` (its sequences or loss tokens), times this factor,
    is its share of the loss normalised by the global count, times world_size; DDP averages gradients over
    ranks, so the update is the gradient of the global loss even when ranks hold different counts.
    """
    total = float(all_reduce([local])[0])
    return world_size() * local / total if total > 0 else 0.0


def gather_cat(t: torch.Tensor) -> torch.Tensor:
    """Every rank's `t` (same shape on each) concatenated along dim 0 in rank order; `t` in one process."""
    if not group_ready() or world_size() == 1:
        return t
    dev = collective_device()
    parts = [torch.empty_like(t, device=dev) for _ in range(world_size())]
    torch.distributed.all_gather(parts, t.contiguous().to(dev))
    return torch.cat(parts).to(t.device)


def gather_rows(tensors: list[torch.Tensor], fill: float = 0.0) -> list[torch.Tensor]:
    """Every rank's 2-D tensors ([n_r, T_r] each, n_r the same for all of a rank's tensors, 0 allowed)
    concatenated along rows in rank order, each padded along dim 1 with `fill` to its widest rank's T;
    the tensors themselves in one process."""
    if not group_ready() or world_size() == 1:
        return tensors
    n = tensors[0].shape[0]
    sizes = all_reduce([n] + [t.shape[1] for t in tensors], "max").long().tolist()  # [n_max, T_1 ..]
    counts = gather_cat(torch.tensor([n], dtype=torch.long)).tolist()  # rows of each rank
    out = []
    for t, width in zip(tensors, sizes[1:]):
        padded = torch.full((sizes[0], width), fill, dtype=t.dtype, device=t.device)  # [n_max, T]
        padded[:n, : t.shape[1]] = t
        parts = gather_cat(padded).split(sizes[0])  # one [n_max, T] block per rank
        out.append(torch.cat([p[:c] for p, c in zip(parts, counts)]))
    return out


def merge_accuracies(mine: dict[str, tuple[float, int]], labels: list[str]) -> dict[str, tuple[float, int]]:
    """{label: (accuracy, n)} over all ranks from each rank's own results on its share of the problems
    (labels: every label any rank can have, in the order wanted; labels no rank saw are left out)."""
    k = len(labels)
    local = [round(mine[d][0] * mine[d][1]) if d in mine else 0 for d in labels]  # correct answers
    local += [mine[d][1] if d in mine else 0 for d in labels]  # problems
    counts = all_reduce(local).tolist()
    return {d: (counts[i] / counts[k + i], int(counts[k + i])) for i, d in enumerate(labels) if counts[k + i]}


def on_main(fn: Callable[[], T]) -> T:
    """fn() on rank 0 only; every rank returns its result, or raises the error it raised (a non-ValueError
    as RuntimeError). The other ranks wait for it, so this is also a barrier. In one process: fn()."""
    if not group_ready() or world_size() == 1:
        return fn()
    box: list = [None]
    error = None
    if rank() == 0:
        try:
            box[0] = (fn(), None)
        except Exception as err:  # handed on, so no rank waits forever for a result
            error = err
            box[0] = (None, err if isinstance(err, ValueError) else RuntimeError(f"rank 0 failed: {err!r}"))
    torch.distributed.broadcast_object_list(box, src=0)
    result, sent = box[0]
    if error is not None:
        raise error
    if sent is not None:
        raise sent
    return result
