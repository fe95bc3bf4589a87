"""Record a plain PyTorch GRPO loop under DDP: each rank writes its own files, grad norms are global.

    torchrun --nproc_per_node 2 scripts/ddp_example.py --run-dir runs/ddp_demo    # 2 processes (gloo on CPU)
    python scripts/ddp_example.py --run-dir runs/ddp_single                        # same global batch,
                                                                                   # 1 process
    tokengrad inspect runs/ddp_demo

The global batch of every step is the same in both commands; each rank trains on its slice of whole
prompt groups. Because the loss is a mean over equally sized slices and DDP averages gradients, the
update (and the recorded grad_norm) of the 2-process run equals the 1-process run on the whole batch.
Rollouts are synthetic (random completions with a toy reward) to keep the example short and
deterministic; swap `make_batch` for real generation.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from tokengrad import Recorder
from tokengrad.objective.advantages import compute_advantages
from tokengrad.objective.loss import policy_loss
from tokengrad.train import distributed as dist
from tokengrad.train.models import make_tiny_model, make_tiny_tokenizer

PROMPT_LEN, COMPLETION_LEN = 6, 10
N_PROMPTS, GROUP = 4, 4  # B prompts x G completions = the global batch of N = 16 sequences


def make_batch(step: int) -> dict:
    """Global batch of `step`: ids [N, P + T], completion mask [N, T], rewards [B, G]
    (stand-in for generation).

    Token ids are bytes (0..255), which every tokenizer of `tokengrad.train.models` can decode."""
    g = torch.Generator().manual_seed(1000 + step)
    n = N_PROMPTS * GROUP
    prompts = torch.randint(0, 256, (N_PROMPTS, PROMPT_LEN), generator=g).repeat_interleave(
        GROUP, 0
    )  # [N, P]
    completions = torch.randint(0, 256, (n, COMPLETION_LEN), generator=g)  # [N, T]
    lengths = torch.randint(COMPLETION_LEN // 2, COMPLETION_LEN + 1, (n,), generator=g)  # [N]
    mask = (torch.arange(COMPLETION_LEN)[None, :] < lengths[:, None]).float()  # [N, T]
    rewards = ((completions < 128).float() * mask).sum(1) / lengths  # [N] share of ASCII bytes
    return {
        "ids": torch.cat([prompts, completions], 1),
        "mask": mask,
        "rewards": rewards.view(N_PROMPTS, GROUP),
    }


def local_slice(n: int) -> slice:
    """This rank's rows: consecutive, equally sized, whole groups (N must divide by world_size * G)."""
    ws, r = dist.world_size(), dist.rank()
    if n % (ws * GROUP):
        raise ValueError(f"global batch {n} does not split into whole groups of {GROUP} over {ws} ranks")
    per = n // ws
    return slice(r * per, (r + 1) * per)


def train_step(st, model, opt, batch: dict) -> None:
    rows = local_slice(batch["ids"].size(0))
    ids, mask = batch["ids"][rows], batch["mask"][rows]  # [n, P + T], [n, T]
    adv = compute_advantages(batch["rewards"]).reshape(-1)[rows]  # [n], groups of the global batch
    sample_ids = torch.arange(batch["ids"].size(0))[rows]  # [n] global ids: unique over ranks
    logits = model(ids).logits[:, PROMPT_LEN - 1 : -1]  # [n, T, V] scores completion tokens
    target = ids[:, PROMPT_LEN:]  # [n, T]
    logprobs = F.log_softmax(logits.float(), -1).gather(2, target.unsqueeze(2)).squeeze(2)  # [n, T]
    old = logprobs.detach()  # on-policy: one update per rollout
    st.track(
        logprobs,
        token_ids=target,
        mask=mask,
        old_logprobs=old,
        advantages=adv,
        sample_ids=sample_ids,
        group_ids=sample_ids // GROUP,
        logits=logits,
    )
    out = policy_loss(logprobs, old, adv, mask, aggregation="grpo")  # mean over this rank's sequences
    st.backward(out.loss)  # DDP all-reduces (averages) the gradients here
    st.record_grad_norms()  # after the all-reduce, before clipping: the global norm
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    loss, n_tok = dist.all_reduce([out.loss.item(), float(mask.sum())]).tolist()
    st.log(loss=loss / dist.world_size(), reward_mean=batch["rewards"].mean().item(), global_tokens=n_tok)
    st.samples(
        sample_ids=sample_ids.tolist(),
        group_ids=(sample_ids // GROUP).tolist(),
        rewards=batch["rewards"].reshape(-1)[rows].tolist(),
        advantages=adv.tolist(),
        lengths=mask.sum(1).int().tolist(),
    )


def main(run_dir: str, steps: int = 2, lr: float = 1e-2) -> None:
    if dist.world_size() > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    tok = make_tiny_tokenizer()
    model = make_tiny_model(tok, seed=0)  # same weights on every rank
    ddp = DistributedDataParallel(model) if dist.world_size() > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    with Recorder(run_dir, model=model, tokenizer=tok, config={"steps": steps, "lr": lr}) as rec:
        for step in range(steps):
            with rec.step(step) as st:
                train_step(st, ddp, opt, make_batch(step))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-2)
    a = ap.parse_args()
    main(a.run_dir, a.steps, a.lr)
