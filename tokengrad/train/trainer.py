"""The built-in GRPO / TR-GRPO trainer: a readable loop of setup(), step() and train().

    tokengrad train configs/tiny_kk.toml steps=20 weighting=tr_grpo
    run_dir = tokengrad.train("configs/tiny_kk.toml", steps=20, weighting="tr_grpo")

One step (GRPO, arXiv 2402.03300, with DAPO's options, arXiv 2503.14476):
  1. generate  B prompts x G sampled completions; tool tasks get their tool turns   -> time_generate
  2. score     verifiable rewards, group-relative advantages, optional dynamic sampling, log pi_old of
               the rollout policy and log pi_ref of the frozen initial model          -> time_score
  3. update    for each phase of the weighting rule (one phase, or Lopti's low-probability tokens then
               the rest, arXiv 2505.12929) and each of num_iterations epochs: one AdamW update built from
               grad_accum micro-batches, after gradient clipping                      -> time_update
Every pass goes through the tokengrad Recorder, which writes the run format (see tokengrad.schema).

Under torchrun / accelerate launch (`torchrun --nproc_per_node 2 -m tokengrad.cli train CONFIG`) each process
samples and trains an equal share of every step's prompt groups in DistributedDataParallel, its loss weighted
so that the update equals one process on the whole batch. Logged scalars are global; rank 0 writes evals and
checkpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from tokengrad.record.fused_logprobs import logprobs_with_stats
from tokengrad.record.recorder import Recorder
from tokengrad.train import distributed as dist
from tokengrad.train.advantages import compute_advantages, keep_groups
from tokengrad.train.checkpoint import checkpoint_after_step, checkpoint_path, resolve_run_dir, resume_state
from tokengrad.train.config import TrainConfig, describe_config, load_config, make_config
from tokengrad.train.loss import micro_batch_share, normaliser, phase_masks, policy_loss
from tokengrad.train.models import load_model
from tokengrad.train.rollout import (
    Rollout,
    evaluate,
    gather_logprobs,
    generate_completions,
    make_rollout,
    policy_forward,
    render_prompt,
    sampling_kwargs,
)
from tokengrad.train.tasks import get_task
from tokengrad.train.weighting import TokenBatch, get_weighting, rule_params, weight_curve


class Batch(NamedTuple):
    """The rollout rows that enter the update (all of them, or the groups dynamic sampling keeps)."""
    input_ids: Tensor              # [N, P + T]
    attention_mask: Tensor         # [N, P + T]
    prompt_len: int                # P
    completion_ids: Tensor         # [N, T]
    mask: Tensor                   # [N, T] 1 = completion token (recorded)
    loss_mask: Tensor              # [N, T] 1 = generated token (tool output is 0)
    advantages: Tensor             # [N]
    old_logprobs: Tensor           # [N, T] log pi_old
    ref_logprobs: Tensor | None    # [N, T] log pi_ref, or None when beta = 0
    sample_ids: Tensor             # [N] row in the step's global rollout (unique over ranks)
    group_ids: Tensor              # [N] prompt of the row, numbered over ranks


class Trainer:
    """GRPO with a pluggable token-weighting rule; `Trainer(cfg).setup().train()` returns the run dir."""

    def __init__(self, config: TrainConfig):
        self.cfg = config

    # ---- setup ------------------------------------------------------------------------------------
    def setup(self) -> "Trainer":
        cfg = self.cfg
        self.device = dist.process_device(cfg.device)
        self.share = dist.shard(cfg.prompts_per_step, "prompts_per_step")   # this rank's prompts of a step
        self.owns_group = dist.init_from_env(self.device)
        self.run_dir = dist.on_main(lambda: resolve_run_dir(cfg))  # one name (and check) for all ranks
        self.task = get_task(cfg.task, **cfg.task_params)  # bad task params fail before the model loads
        self.rule, self.rule_params = get_weighting(cfg.weighting), _rule_kwargs(cfg)
        state = resume_state(cfg, self.run_dir) if cfg.resume else None
        source = str(checkpoint_path(self.run_dir) / "model") if state else cfg.model
        self.model, self.tok = load_model(source, seed=cfg.seed)
        # Dropout off for good: pi_old, the update's pi and the sampling policy must be one function.
        self.model.to(self.device).eval()
        # (logits, hidden) = self.policy(ids, attn, P) for the loss, in DDP under torchrun; generation and
        # scoring use the model itself.
        self.policy = dist.wrap(dist.ModelFunction(policy_forward, self.model), self.device)
        # The reference is the initial policy, so a resumed run reloads it from the original model.
        self.ref = (
            _frozen(
                load_model(cfg.model, seed=cfg.seed)[0] if state else copy.deepcopy(self.model), self.device
            )
            if cfg.beta > 0
            else None
        )
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.start_step = 0
        if state:
            self.opt.load_state_dict(state["optimizer"])
            self.start_step = state["step"] + 1
        # Tasks draw problems as a seeded stream, so a longer pool (a resumed run with more steps) starts
        # with the same problems as a shorter one.
        self.problems = self.task.train_problems(
            cfg.n_train_problems or cfg.prompts_per_step * cfg.steps, cfg.seed
        )
        self.eval_problems = (
            self.task.eval_problems(cfg.eval_per_difficulty, cfg.seed) if cfg.eval_every else []
        )
        # Dr. GRPO divides by a constant: the most generated tokens a completion can hold.
        self.max_len = cfg.max_new_tokens * (cfg.max_turns if self.task.tool_stop else 1)
        self.rec = Recorder(
            self.run_dir,
            model=self.model,
            tokenizer=self.tok,
            config=cfg.to_dict(),
            run_name=cfg.run_name or self.run_dir.name,
            model_name=cfg.model,
            weighting=self.weighting_meta(),
            bucket_every=cfg.bucket_every,
            attribute_every=cfg.attribute_every,
            attribute_method=cfg.attribute_method,
            token_budget=cfg.token_budget or None,
            resume_step=self.start_step if cfg.resume else None,  # no checkpoint yet: from step 0
        )
        return self

    def weighting_meta(self) -> dict:
        params = {**rule_params(self.cfg.weighting), **self.rule_params}
        params = {k: v for k, v in params.items() if isinstance(v, (int, float, str, bool, type(None)))}
        return {
            "name": self.cfg.weighting,
            "params": params,
            "curve": weight_curve(self.cfg.weighting, self.rule_params),
        }

    # ---- the loop ---------------------------------------------------------------------------------
    def train(self) -> Path:
        cfg = self.cfg
        bar = tqdm(
            range(self.start_step, cfg.steps),
            initial=self.start_step,
            total=cfg.steps,
            disable=not cfg.progress or not dist.is_main(),
            desc=f"{cfg.task}/{cfg.weighting}",
            dynamic_ncols=True,
        )
        with dist.ending(self.owns_group), self.rec:
            if cfg.eval_every and cfg.eval_at_start and self.start_step == 0:
                self.evaluate(-1)  # the starting policy, logged as step -1: before step 0's update
            for step in bar:
                logged = self.step(step)
                bar.set_postfix(
                    reward=f"{logged['reward_mean']:.3f}", gnorm=f"{logged.get('grad_norm', math.nan):.3g}"
                )
                last = step == cfg.steps - 1
                if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or last):
                    self.evaluate(step)
                if cfg.checkpoint and (
                    last or (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0)
                ):
                    # every rank's rows of steps <= step reach disk first; rank 0 writes it
                    checkpoint_after_step(self.rec, self.run_dir, step, self.model, self.tok, self.opt,
                                          cfg.to_dict())
        return self.run_dir

    def step(self, step: int) -> dict:
        """One rollout batch and its updates; returns the scalars logged to the steps table."""
        # Sampling depends on (seed, step, rank) only, so a resumed run repeats an uninterrupted one.
        torch.manual_seed((self.cfg.seed * 1_000_003 + step) * dist.world_size() + dist.rank())
        lr = self.set_lr(step)
        with self.rec.step(step) as st:
            t0 = time.perf_counter()
            problems = self.problems_for(step)
            with self.autocast():
                comps = generate_completions(
                    self.model,
                    self.tok,
                    [render_prompt(self.tok, p) for p in problems],
                    self.cfg.group_size,
                    self.cfg.max_new_tokens,
                    self.sampling,
                    self.task,
                    self.cfg.max_turns,
                )
            t1 = time.perf_counter()
            rollout = make_rollout(comps, self.task, problems, self.tok)
            # [B, G, 3] reward, correct, length of every rank's groups, in prompt order
            scores = dist.gather_cat(
                torch.stack(
                    [rollout.rewards, rollout.correct.float(), rollout.mask.sum(1).view_as(rollout.rewards)],
                    -1,
                )
            )
            batch, advantages = self.score(rollout, scores[..., 0])
            t2 = time.perf_counter()
            logged = self.update(st, batch, rollout)
            t3 = time.perf_counter()
            logged.update(
                rollout_stats(scores), lr=lr, time_generate=t1 - t0, time_score=t2 - t1, time_update=t3 - t2
            )
            st.log(**logged)
            self.log_samples(st, rollout, advantages, batch)
        return logged

    @torch.no_grad()
    def score(self, r: Rollout, all_rewards: Tensor) -> tuple[Batch | None, Tensor]:
        """Advantages of this rank's rows ([B, G]), scaled over the global batch ([B_all, G] rewards), and
        the update batch (None if dynamic sampling drops all of this rank's groups)."""
        B, G = r.rewards.shape
        advantages = compute_advantages(all_rewards, self.cfg.adv_scale)[self.share]  # [B, G]
        keep = keep_groups(r.rewards) if self.cfg.dynamic_sampling else torch.ones(B, dtype=torch.bool)  # [B]
        rows = keep.repeat_interleave(G).nonzero().squeeze(1)  # [N]
        if rows.numel() == 0:
            return None, advantages
        on = lambda x: x[rows].to(self.device)  # noqa: E731
        ids, attn, comp = on(r.input_ids), on(r.attention_mask), on(r.completion_ids)
        old = self.logprobs(self.model, ids, attn, r.prompt_len, comp)
        ref = self.logprobs(self.ref, ids, attn, r.prompt_len, comp) if self.ref is not None else None
        first = self.share.start * G  # global id of this rank's first row
        batch = Batch(
            input_ids=ids, attention_mask=attn, prompt_len=r.prompt_len, completion_ids=comp,
            mask=on(r.mask), loss_mask=on(r.loss_mask), advantages=on(advantages.flatten()),
            old_logprobs=old, ref_logprobs=ref, sample_ids=(rows + first).to(self.device),
            group_ids=(rows // G + self.share.start).to(self.device),
        )
        return batch, advantages

    def update(self, st, b: Batch | None, r: Rollout) -> dict:
        """num_iterations optimizer updates per phase of the weighting rule, each built from grad_accum
        backward passes (micro-batches). Returns global scalars."""
        cfg = self.cfg
        update_masks = self.update_masks(b)  # each [N, T]
        # Every rank must join every gradient all-reduce, also one whose groups dynamic sampling all dropped.
        n_updates, any_idle = (int(x) for x in dist.all_reduce([len(update_masks), b is None], "max"))
        if n_updates == 0:
            return {"n_updates": 0}
        st.is_bucket_step = st.is_bucket_step and not any_idle  # bucket all-reduces need every rank's buckets
        rank_scale = dist.rank_scale(normaliser(cfg.aggregation, b.loss_mask) if b is not None else 0.0)
        losses, kls, norms = [], [], []
        for update_id in range(n_updates):
            if b is None:  # zeros into the all-reduce: one row's forward, times 0
                parts = dist.idle_backward(
                    self.policy,
                    r.input_ids[:1].to(self.device),
                    r.attention_mask[:1].to(self.device),
                    r.prompt_len,
                )
            else:  # under DDP only the last micro-batch's backward all-reduces the gradients
                micro = self.micro_batches(len(b.sample_ids))
                mask = update_masks[update_id]
                parts = [self.loss_pass(st, b, rows, mask, update_id, rank_scale, i == len(micro) - 1)
                         for i, rows in enumerate(micro)]
            losses.append(sum(p[0] for p in parts))
            kls += [p[1] for p in parts]
            # records the norms before clipping, then clips with that same norm (gradients read once)
            norms.append(
                st.clip_grad_norm_(cfg.grad_clip, update_id)
                if cfg.grad_clip > 0
                else st.record_grad_norms(update_id)
            )
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        if st.is_bucket_step:  # how the update moved the probabilities of the first tracked micro-batch
            rows = self.micro_batches(len(b.sample_ids))[0]
            st.record_prob_change(
                self.logprobs(
                    self.model,
                    b.input_ids[rows],
                    b.attention_mask[rows],
                    b.prompt_len,
                    b.completion_ids[rows],
                )
            )
        loss, kl, n_kl = dist.all_reduce([sum(losses), sum(kls), len(kls)]).tolist()
        out = {"loss": loss / dist.world_size() / n_updates, "grad_norm": max(norms), "n_updates": n_updates}
        if cfg.beta > 0:
            out["kl"] = kl / max(n_kl, 1)
        return out

    def update_masks(self, b: Batch | None) -> list[Tensor]:
        """The loss mask of each optimizer update: num_iterations per phase of the weighting rule ([N, T]
        each; none without rows)."""
        if b is None:
            return []
        # Phases (Lopti) are fixed from pi_old for the whole step, so they are found once, up front.
        first = self.rule(
            TokenBatch(b.old_logprobs, b.old_logprobs, b.advantages, b.loss_mask), **self.rule_params
        )
        return [phase for phase in phase_masks(first, b.loss_mask) for _ in range(self.cfg.num_iterations)]

    def loss_pass(
        self,
        st,
        b: Batch,
        rows: Tensor,
        update_mask: Tensor,
        update_id: int,
        rank_scale: float = 1.0,
        sync: bool = True,
    ) -> tuple[float, float]:
        """Forward, weighting rule, GRPO loss and backward of one micro-batch (one backward pass); returns
        (loss, kl). `rank_scale` is this rank's `dist.rank_scale` (1 in one process); `sync`: the backward
        all-reduces (DDP)."""
        cfg = self.cfg
        with self.autocast(), dist.sync_grads(self.policy, sync):  # DDP decides in the forward
            logits, hidden = self.policy(b.input_ids[rows], b.attention_mask[rows], b.prompt_len)
        # log pi and the recorder's softmax statistics from one pass over the vocabulary (fused_logprobs)
        logprobs, stats = logprobs_with_stats(logits, b.completion_ids[rows])  # [n, T]
        old, adv, loss_mask = b.old_logprobs[rows], b.advantages[rows], b.loss_mask[rows]
        ref = b.ref_logprobs[rows] if b.ref_logprobs is not None else None
        weights = self.rule(TokenBatch(logprobs, old, adv, loss_mask), **self.rule_params)
        out = policy_loss(
            logprobs, old, adv, update_mask[rows], weights, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
            beta=cfg.beta, ref_logprobs=ref, aggregation=cfg.aggregation, max_len=self.max_len,
            norm_mask=loss_mask,
        )
        st.track(
            logprobs,
            token_ids=b.completion_ids[rows],
            mask=b.mask[rows],
            loss_mask=update_mask[rows],
            old_logprobs=old,
            ref_logprobs=ref,
            advantages=adv,
            weights=weights.effective(logprobs),
            sample_ids=b.sample_ids[rows],
            group_ids=b.group_ids[rows],
            stats=stats,
            hidden=hidden,
            clipped=out.clipped,
            update_id=update_id,
            recompute=lambda: self.logprobs(self.model, b.input_ids[rows], b.attention_mask[rows],
                                            b.prompt_len, b.completion_ids[rows]),
        )
        share = micro_batch_share(cfg.aggregation, loss_mask, b.loss_mask) * rank_scale
        st.backward(out.loss * share)
        return out.loss.item() * share, out.metrics["kl_mean"]

    def evaluate(self, step: int) -> dict:
        """Greedy accuracy on the held-out problems, per difficulty, into the evals table (each rank
        evaluates every world_size-th problem; rank 0 writes the summed counts)."""
        with self.autocast():
            mine = evaluate(
                self.model,
                self.tok,
                self.task,
                self.eval_problems[dist.rank() :: dist.world_size()],
                self.cfg.max_new_tokens,
                self.cfg.max_turns,
                self.cfg.prompts_per_step * self.cfg.group_size,
            )
        results = dist.merge_accuracies(mine, sorted({str(p.difficulty) for p in self.eval_problems}))
        for difficulty, (accuracy, n) in results.items() if dist.is_main() else ():
            self.rec.log_eval(step, task=self.cfg.task, difficulty=difficulty, accuracy=accuracy, n=n)
        return results

    # ---- helpers ----------------------------------------------------------------------------------
    @property
    def sampling(self) -> dict:
        return sampling_kwargs(self.cfg.temperature, self.cfg.top_p)

    def autocast(self):
        if not self.cfg.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def set_lr(self, step: int) -> float:
        """Linear warm-up over `warmup_steps` steps, then constant; a function of the step alone."""
        w = self.cfg.warmup_steps
        lr = self.cfg.lr * min(1.0, (step + 1) / w) if w else self.cfg.lr
        for group in self.opt.param_groups:
            group["lr"] = lr
        return lr

    def problems_for(self, step: int) -> list:
        """This rank's share of the step's prompts (all of them in one process)."""
        B, pool = self.cfg.prompts_per_step, self.problems
        return [pool[(step * B + j) % len(pool)] for j in range(B)][self.share]

    def micro_batches(self, n: int) -> list[Tensor]:
        return list(torch.arange(n, device=self.device).chunk(self.cfg.grad_accum))

    @torch.no_grad()
    def logprobs(self, model, ids: Tensor, attn: Tensor, prompt_len: int, comp: Tensor) -> Tensor:
        """[N, T] log-probs of the completion tokens under `model`, micro-batch by micro-batch."""
        out = []
        for rows in self.micro_batches(len(ids)):
            with self.autocast():
                logits, _ = policy_forward(model, ids[rows], attn[rows], prompt_len)
            out.append(gather_logprobs(logits, comp[rows]))
        return torch.cat(out)

    def log_samples(self, st, r: Rollout, advantages: Tensor, batch: Batch | None) -> None:
        B, G = r.rewards.shape
        first = self.share.start * G  # global id of this rank's first row
        per_row = lambda xs: [x for x in xs for _ in range(G)]  # noqa: E731  prompt-level -> row-level
        in_update = torch.zeros(B * G, dtype=torch.long)
        if batch is not None:
            in_update[batch.sample_ids.cpu() - first] = 1
        meta = {k: per_row(v) for k, v in _scalar_meta(r.problems).items()}
        st.samples(
            sample_ids=list(range(first, first + B * G)),
            group_ids=[(first + i) // G for i in range(B * G)],
            prompts=per_row([p.prompt for p in r.problems]),
            completions=r.texts,
            rewards=r.rewards.flatten().tolist(),
            advantages=advantages.flatten().tolist(),
            lengths=r.mask.sum(1).long().tolist(),
            task=self.cfg.task,
            difficulty=per_row([str(p.difficulty) for p in r.problems]),
            correct=r.correct.flatten().long().tolist(),
            in_update=in_update.tolist(),
            n_tool_calls=list(r.n_tool_calls),
            answer=per_row([str(p.answer) for p in r.problems]),
            **meta,
        )


def rollout_stats(scores: Tensor) -> dict:
    """Step scalars of the global rollout from its [B, G, 3] reward, correct, length."""
    rewards = scores[..., 0].flatten()  # [N]
    return {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "accuracy": float(scores[..., 1].mean()),
        "completion_len": float(scores[..., 2].mean()),
    }


def _scalar_meta(problems: list) -> dict[str, list]:
    """Problem.meta entries that every problem has as a scalar: extra columns of the samples table."""
    keys = set.intersection(*(set(p.meta) for p in problems)) if problems else set()
    keys = {k for k in keys if all(isinstance(p.meta[k], (int, float, str, bool)) for p in problems)}
    return {f"meta_{k}": [p.meta[k] for p in problems] for k in sorted(keys)}


def _rule_kwargs(cfg: TrainConfig) -> dict:
    """The rule's parameters from the config; a rule that takes the clip range gets the loss's own."""
    shared = {k: getattr(cfg, k) for k in ("eps_low", "eps_high") if k in rule_params(cfg.weighting)}
    return {**shared, **cfg.weighting_params}


def _frozen(model, device) -> torch.nn.Module:
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# ---- entry points ---------------------------------------------------------------------------------
def train(
    config_or_path: str | os.PathLike | TrainConfig | Mapping[str, Any] | None = None, **overrides
) -> Path:
    """Run the trainer; returns the run directory. `config_or_path`: a TOML/YAML path, a TrainConfig, a
    dict of keys, or None (defaults); keyword overrides win, e.g. `train("configs/tiny_kk.toml", steps=2)`."""
    if isinstance(config_or_path, TrainConfig):
        cfg = make_config({**config_or_path.to_dict(), **overrides})
    elif isinstance(config_or_path, Mapping):
        cfg = load_config(None, {**config_or_path, **overrides})
    else:
        cfg = load_config(config_or_path, overrides)
    return Trainer(cfg).setup().train()


def cli_train(argv: list[str]) -> int:
    """`tokengrad train CONFIG [key=value ...] [--run-dir DIR] [--resume]`."""
    parser = argparse.ArgumentParser(
        prog="tokengrad train",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train with GRPO and a token-weighting rule; records a tokengrad run.",
        epilog="config keys (set in the file or as key=value):\n" + describe_config(),
    )
    parser.add_argument("config", help="TOML or YAML config file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override config keys")
    parser.add_argument("--run-dir", help="run directory (same as run_dir=...)")
    parser.add_argument("--resume", action="store_true", help="continue the run in the run directory")
    args = parser.parse_intermixed_args(argv)
    extra = [f"run_dir={args.run_dir}"] * bool(args.run_dir) + ["resume=true"] * args.resume
    cfg = load_config(args.config, [*args.overrides, *extra])  # a ValueError ends in the CLI's error line
    trainer = Trainer(cfg).setup()
    run_dir = trainer.train()
    if dist.is_main():
        print(run_dir)
    return 0
