"""A step's rollout: one generation round, or DAPO dynamic sampling that refills the batch.

    gathered = gather_rollout(generate_round, task, tok, prompts=B, group_size=G, share=share,
                              filter_groups=True, max_rounds=3, adv_scale="group")

DAPO dynamic sampling (arXiv 2503.14476, Sec. 3.2; verl's `filter_groups` with `max_num_gen_batches`): a
group whose G rewards are all equal has advantage 0 everywhere and trains nothing. Rounds of B prompts are
generated until B informative groups are in hand or `max_rounds` rounds have run; the first B informative
groups (round, then prompt order) form the update batch. `max_rounds = 1` is the filter alone: the
informative groups of a single round.

Rows are numbered over all rounds and ranks: round k, global prompt j, sample g -> sample id
(k B + j) G + g, group id k B + j; with one round these are the ids of a plain step.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from tokengrad.objective.advantages import compute_advantages, keep_groups
from tokengrad.train import distributed as dist
from tokengrad.train.generation import Completions, GenerationBatch, make_generation_batch

# round k -> (this rank's completions, its problems, (rewards [b, G], correct [b, G]))
RoundFn = Callable[[int], "tuple[Completions, list, tuple[Tensor, Tensor]]"]


class Gathered(NamedTuple):
    rollout: GenerationBatch  # this rank's rows of every round, concatenated (prompt-major within a round)
    sample_ids: Tensor  # [n] global id of each of this rank's rows
    group_ids: Tensor  # [n] global group id of each row
    in_update: Tensor  # [n] bool: the row's group is in the update batch
    advantages: Tensor  # [b_all_rounds, G] advantages of this rank's groups
    scores: Tensor  # [R B, G, 3] reward, correct, length of every round's global groups
    n_rounds: int  # generation rounds run
    n_kept: int  # groups in the update batch (all ranks)


def gather_rollout(
    generate_round: RoundFn,
    task,
    tokenizer,
    *,
    prompts: int,
    group_size: int,
    share: slice,
    filter_groups: bool,
    max_rounds: int,
    adv_scale: str,
) -> Gathered:
    """Generate rounds until `prompts` informative groups (all ranks together) or `max_rounds`; without
    `filter_groups` one round, all of it kept."""
    B, G = prompts, group_size
    parts, all_scores, n_informative = [], [], 0
    for k in range(max_rounds if filter_groups else 1):
        comps, problems, (rewards, correct) = generate_round(k)
        lengths = torch.tensor([len(c) for c in comps.completion_ids], dtype=torch.float).view_as(rewards)
        scores = dist.gather_cat(torch.stack([rewards, correct.float(), lengths], -1))  # [B, G, 3]
        parts.append((comps, problems, rewards, correct))
        all_scores.append(scores)
        n_informative += int(keep_groups(scored(scores[..., 0])).sum())
        if n_informative >= B:
            break
    scores = torch.cat(all_scores)  # [R B, G, 3]
    R = len(all_scores)
    keep = (
        keep_groups(scored(scores[..., 0])) if filter_groups else torch.ones(R * B, dtype=torch.bool)
    )  # [R B]
    keep &= keep.cumsum(0) <= B  # the first B informative groups, as verl truncates to the batch size
    mine = torch.cat([torch.arange(share.start, share.stop) + k * B for k in range(R)])  # [b R] global groups
    comps = Completions(
        **{f.name: sum((list(getattr(p[0], f.name)) for p in parts), []) for f in fields(Completions)}
    )
    problems = [pr for p in parts for pr in p[1]]
    rewards, correct = torch.cat([p[2] for p in parts]), torch.cat([p[3] for p in parts])
    rollout = make_generation_batch(comps, task, problems, tokenizer, scores=(rewards, correct))
    group_ids = mine.repeat_interleave(G)  # [n]
    return Gathered(
        rollout=rollout,
        sample_ids=group_ids * G + torch.arange(G).repeat(len(mine)),
        group_ids=group_ids,
        in_update=keep[mine].repeat_interleave(G),
        advantages=compute_advantages(scored(scores[..., 0]), adv_scale)[mine],
        scores=scores,
        n_rounds=R,
        n_kept=int(keep.sum()),
    )


def scored(rewards: Tensor) -> Tensor:
    """[B, G] rewards for the advantages: a NaN reward (a completion the task could not score) takes its
    group's mean, so its advantage is 0 and it neither rewards nor penalises; the samples table keeps NaN."""
    unscored = torch.isnan(rewards)  # [B, G]
    if not bool(unscored.any()):
        return rewards
    mean = rewards.nanmean(dim=1, keepdim=True).nan_to_num(0.0)  # [B, 1] 0 for a group with no score
    return torch.where(unscored, mean.expand_as(rewards), rewards)


def rollout_stats(scores: Tensor) -> dict:
    """Step scalars of the global rollout from its [B, G, 3] reward, correct, length."""
    rewards = scores[..., 0].flatten()  # [N]
    return {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "accuracy": float(scores[..., 1].mean()),
        "completion_len": float(scores[..., 2].mean()),
    }


def scalar_meta(problems: list) -> dict[str, list]:
    """Problem.meta entries that every problem has as a scalar: extra columns of the samples table."""
    keys = set.intersection(*(set(p.meta) for p in problems)) if problems else set()
    keys = {k for k in keys if all(isinstance(p.meta[k], (int, float, str, bool)) for p in problems)}
    return {f"meta_{k}": [p.meta[k] for p in problems] for k in sorted(keys)}


def sample_rows(g: Gathered, task: str, group_size: int) -> dict:
    """The samples-table columns of every generated row (`StepRecorder.samples` keywords)."""
    r, G = g.rollout, group_size
    per_row = lambda xs: [x for x in xs for _ in range(G)]  # noqa: E731  prompt-level -> row-level
    meta = {k: per_row(v) for k, v in scalar_meta(r.problems).items()}
    return dict(
        sample_ids=g.sample_ids.tolist(),
        group_ids=g.group_ids.tolist(),
        prompts=per_row([p.prompt for p in r.problems]),
        completions=r.texts,
        rewards=r.rewards.flatten().tolist(),
        advantages=g.advantages.flatten().tolist(),
        lengths=r.mask.sum(1).long().tolist(),
        task=task,
        difficulty=per_row([str(p.difficulty) for p in r.problems]),
        correct=r.correct.flatten().long().tolist(),
        in_update=g.in_update.long().tolist(),
        n_tool_calls=list(r.n_tool_calls),
        answer=per_row([str(p.answer) for p in r.problems]),
        **meta,
    )
