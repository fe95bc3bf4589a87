"""Supervised fine-tuning (teacher forcing on completion tokens) on the trainer's own prompt layout.

    examples = lambda step: [(render_prompt(tok, p), target) for p, target in ...]   # (prompt, target) pairs
    history = supervised_train(model, tok, examples, SFTConfig(steps=1500, lr=2e-3), evaluate=fn)

The lab models' warm start (scripts/make_lab_model.py) and the SFT-continuation control of the study
(scripts/study.py). Prompts are encoded exactly as the GRPO trainer encodes them (rollout.encode_prompt)
and packed with the same left-padded prompt / right-padded completion layout (rollout.pack), and the loss
reads the same completion log-probabilities (rollout.policy_forward), so SFT and RL see identical token
ids. The loss is the mean negative log-likelihood over completion tokens, end-of-sequence included.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor
from tqdm.auto import tqdm

from tokengrad.train.generation import encode_prompt, gather_logprobs, pack, policy_forward

Examples = Callable[[int], list[tuple[str, str]]]  # step -> (prompt text, target completion text) pairs


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 1000  # optimizer updates
    lr: float = 1e-3  # peak AdamW learning rate
    min_lr: float = 0.0  # the cosine schedule's final learning rate
    warmup_steps: int = 50  # linear warm-up, then cosine decay to min_lr at `steps`
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # total-norm clip (0 = off)
    eval_every: int = 0  # call `evaluate` every N steps and after the last (0 = only after the last)
    max_seconds: float = 0.0  # stop early after this much wall time (0 = no limit; the study's control)
    progress: bool = True


def lr_at(cfg: SFTConfig, step: int) -> float:
    """Linear warm-up to cfg.lr, then half a cosine down to cfg.min_lr at cfg.steps."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    t = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * t))


def encode_examples(tok, examples: list[tuple[str, str]]) -> tuple[Tensor, Tensor, int, Tensor, Tensor]:
    """(input_ids [N, P+T], attention_mask, P, completion_ids [N, T], mask [N, T]) of (prompt, target)
    pairs; every target gets the tokenizer's end-of-sequence token, which the model must learn to emit."""
    prompts = [encode_prompt(tok, p) for p, _ in examples]
    targets = [tok(t, add_special_tokens=False).input_ids + [tok.eos_token_id] for _, t in examples]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids, attn, P, comp, mask, _ = pack(prompts, targets, [[1] * len(t) for t in targets], pad)
    return ids, attn, P, comp, mask


def sft_loss(model, batch: tuple[Tensor, Tensor, int, Tensor, Tensor]) -> Tensor:
    """Mean NLL of the completion tokens (scalar)."""
    ids, attn, P, comp, mask = batch
    logits, _ = policy_forward(model, ids, attn, P)  # [N, T, V]
    nll = -gather_logprobs(logits, comp)  # [N, T]
    return (nll * mask).sum() / mask.sum()


def supervised_train(
    model, tok, examples: Examples, cfg: SFTConfig, evaluate: Callable[[int], dict] | None = None
) -> list[dict]:
    """Train `model` in place; returns one record per evaluation: {step, seconds, loss, **evaluate(step)}.

    Dropout is off (eval mode) so the supervised model is the same function the RL trainer samples from.
    """
    model.eval()
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    history: list[dict] = []
    t0, losses = time.perf_counter(), []
    bar = tqdm(range(cfg.steps), desc="sft", disable=not cfg.progress, dynamic_ncols=True)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        encoded = encode_examples(tok, examples(step))
        batch = tuple(x.to(device) if isinstance(x, Tensor) else x for x in encoded)
        loss = sft_loss(model, batch)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{lr_at(cfg, step):.2e}")
        elapsed = time.perf_counter() - t0
        out_of_time = cfg.max_seconds > 0 and elapsed >= cfg.max_seconds
        last = step == cfg.steps - 1 or out_of_time
        if evaluate is not None and (last or (cfg.eval_every and (step + 1) % cfg.eval_every == 0)):
            record = {"step": step, "seconds": elapsed, "loss": sum(losses) / len(losses), **evaluate(step)}
            history.append(record)
            bar.write(
                " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items())
            )
            losses = []
        if out_of_time:
            break
    return history
