"""Record a plain PyTorch GRPO loop whose model is sharded (FSDP2 `fully_shard`, FSDP1) or replicated
(DDP): per-block norms, bucket analysis and the step's grad_norm equal one process on the whole batch.

    torchrun --nproc_per_node 2 scripts/sharded_example.py --run-dir runs/fsdp2 --wrap fsdp2 --buckets 1
    python scripts/sharded_example.py --run-dir runs/single --wrap none --buckets 1   # the same global batch
    tokengrad inspect runs/fsdp2

`--attribution 1` adds each token's update_share and dlogprob_pred (a sharded model takes the central
difference at perturbed shards: compare with `--method central_difference` in one process). `--wrap`: one of
WRAPS (none, ddp, fsdp2, fsdp2_mixed (bf16 compute, fp32 reduction), fsdp1 (original parameters), fsdp1_flat
(flat parameters)). `--micro 2` splits each rank's rows into two backward passes
of one update (gradient accumulation). The rollouts are those of scripts/ddp_example.py (synthetic,
deterministic); each rank trains on its slice of whole prompt groups and the loss is a mean over equally
sized slices, so the sharded update is the one-process update.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

from tokengrad import Recorder
from tokengrad.objective.advantages import compute_advantages
from tokengrad.objective.loss import policy_loss
from tokengrad.record.options import Attribution, Buckets
from tokengrad.registry import Registry
from tokengrad.train import distributed as dist
from tokengrad.train.models import make_tiny_model, make_tiny_tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_example import GROUP, PROMPT_LEN, local_slice, make_batch  # noqa: E402

# name -> (model) -> the module the loop calls; the recorder is given that module
WRAPS: Registry = Registry("wrapper")


@WRAPS.register("none")
def no_wrap(model):
    """One process, or every rank its own copy."""
    return model


@WRAPS.register("ddp")
def ddp(model):
    """DistributedDataParallel: every rank the whole averaged gradient."""
    return torch.nn.parallel.DistributedDataParallel(model)


def _fully_shard(model, **kwargs):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    return fully_shard(model, **kwargs)


@WRAPS.register("fsdp2")
def fsdp2(model):
    """FSDP2: each decoder layer and the root sharded over the ranks, parameters as DTensor shards."""
    return _fully_shard(model)


@WRAPS.register("fsdp2_mixed")
def fsdp2_mixed(model):
    """FSDP2 with a MixedPrecisionPolicy: bf16 forward and backward, fp32 gradient reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return _fully_shard(model, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32))


def _fsdp1(model, use_orig_params: bool):
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy({type(model.model.layers[0])}),
        use_orig_params=use_orig_params,
        device_id=device or torch.device("cpu"),
    )


@WRAPS.register("fsdp1")
def fsdp1(model):
    """FSDP1 FullyShardedDataParallel per decoder layer, use_orig_params=True."""
    return _fsdp1(model, use_orig_params=True)


@WRAPS.register("fsdp1_flat")
def fsdp1_flat(model):
    """FSDP1 with flat parameters (use_orig_params=False)."""
    return _fsdp1(model, use_orig_params=False)


def completion_logprobs(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi [m, T] of the completion tokens with graph, the targets [m, T])."""
    logits = model(ids).logits[:, PROMPT_LEN - 1 : -1]  # [m, T, V]
    target = ids[:, PROMPT_LEN:]  # [m, T]
    return F.log_softmax(logits.float(), -1).gather(2, target.unsqueeze(2)).squeeze(2), target


def train_step(st, model, opt, batch: dict, micro: int) -> None:
    rows = local_slice(batch["ids"].size(0))
    adv_all = compute_advantages(batch["rewards"]).reshape(-1)  # [N] groups of the global batch
    sample_ids = torch.arange(batch["ids"].size(0))[rows]  # [n] unique over ranks
    for part in sample_ids.chunk(micro):  # micro-batches of one update
        ids, mask, adv = batch["ids"][part], batch["mask"][part], adv_all[part]  # [m, P + T], [m, T], [m]
        logprobs, target = completion_logprobs(model, ids)  # [m, T]
        old = logprobs.detach()
        ids_of = dict(sample_ids=part, group_ids=part // GROUP)  # [m] each
        again = lambda ids=ids: completion_logprobs(model, ids)[0]  # noqa: E731 (attribution steps)
        st.track(
            logprobs, token_ids=target, mask=mask, old_logprobs=old, advantages=adv, **ids_of, recompute=again
        )
        loss = policy_loss(logprobs, old, adv, mask, aggregation="grpo").loss / micro
        st.backward(loss)
    st.clip_grad_norm_(1.0)  # the global pre-clip norm, each rank clips its shard with it
    opt.step()
    opt.zero_grad()
    st.log(reward_mean=batch["rewards"].mean().item())


# the tiny random model's probabilities lie near 1/259: edges that split them into four populated buckets
EDGES = (0.0, 0.0036, 0.0039, 0.0042, 1.0)


def main(
    run_dir: str, wrap: str = "none", *, steps=2, buckets=1, micro=1, attribution=0, method="jvp"
) -> None:
    if dist.world_size() > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    tok = make_tiny_tokenizer()
    model = WRAPS[wrap](make_tiny_model(tok, seed=0))  # same weights on every rank
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    every, attribute = Buckets(buckets, EDGES), Attribution(attribution, method=method)
    with Recorder(
        run_dir, model=model, tokenizer=tok, buckets=every, attribution=attribute, config={"wrap": wrap}
    ) as rec:
        for step in range(steps):
            with rec.step(step) as st:
                train_step(st, model, opt, make_batch(step), micro)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--wrap", default="none", choices=sorted(WRAPS))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--buckets", type=int, default=1)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument(
        "--attribution", type=int, default=0, help="each token's share of the update every N steps"
    )
    ap.add_argument("--method", default="jvp", help="attribution method (sharded models: shard_difference)")
    a = ap.parse_args()
    main(
        a.run_dir,
        a.wrap,
        **{k: getattr(a, k) for k in ("steps", "buckets", "micro", "attribution", "method")},
    )
    os._exit(0)  # FSDP's background threads can abort the interpreter's teardown; the run is closed
