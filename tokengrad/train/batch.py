"""The update batch and its schedule: which rows each optimizer update trains on, and each update's token
weights computed once over its rows, then sliced per micro-batch.

    layout = row_layout(n_rows, mini_batches=2, grad_accum=2)            # [[micro, micro], [micro, micro]]
    for u in plan_updates(layout, phases, num_iterations=2):            # phase > epoch > mini-batch
        ... one optimizer step from u.micro ...

Schedule (PPO, arXiv 1707.06347; verl's ppo_epochs x mini-batches; Lopti's phases, arXiv 2505.12929, outside
both): for each phase of the weighting rule, for each of `num_iterations` epochs, for each of `mini_batches`
disjoint row subsets, one optimizer step built from `grad_accum` micro-batches.

Batch statistics (CW-GRPO's centring and sigma, Clip-Cov's count and draw, KL-Cov's top-k) are taken over
the rows of one optimizer update, so `grad_accum` only changes how the gradient is accumulated, never the
algorithm. Under several processes each rank takes them over its own share of the update's rows.
"""

from __future__ import annotations

from dataclasses import fields
from typing import NamedTuple

import torch
from torch import Tensor

from tokengrad.objective.rule_contract import TokenBatch, TokenWeights, WeightingRule


class Batch(NamedTuple):
    """The rollout rows that enter the update (all of them, or the groups dynamic sampling keeps)."""

    input_ids: Tensor  # [N, P + T]
    attention_mask: Tensor  # [N, P + T]
    prompt_len: int  # P
    completion_ids: Tensor  # [N, T]
    mask: Tensor  # [N, T] 1 = completion token (recorded)
    loss_mask: Tensor  # [N, T] 1 = generated token (tool output is 0)
    advantages: Tensor  # [N]
    old_logprobs: Tensor  # [N, T] log pi_old (NaN until the loss pass when GRPOUpdate.reuses_old)
    ref_logprobs: Tensor | None  # [N, T] log pi_ref, or None when beta = 0
    rollout_logprobs: Tensor  # [N, T] log-prob under the sampler's distribution (NaN where none)
    is_weights: Tensor | None  # [N, T] or [N, 1] rollout correction's weight (train.correction); None: off
    sample_ids: Tensor  # [N] row in the step's global rollout (unique over ranks)
    group_ids: Tensor  # [N] prompt of the row, numbered over ranks


def select_rows(g, device) -> Batch | None:
    """The rows of the update batch (the kept groups of a `sampling.Gathered`) on `device`, without log pi_old
    and log pi_ref yet (zeros and None); None when this rank keeps no group."""
    r, rows = g.rollout, g.in_update.nonzero().squeeze(1)  # [N]
    if not rows.numel():
        return None
    on = lambda x: x[rows].to(device)  # noqa: E731
    comp = on(r.completion_ids)
    return Batch(
        input_ids=on(r.input_ids),
        attention_mask=on(r.attention_mask),
        prompt_len=r.prompt_len,
        completion_ids=comp,
        mask=on(r.mask),
        loss_mask=on(r.loss_mask),
        advantages=on(g.advantages.flatten()),
        old_logprobs=torch.zeros(comp.shape, device=device),
        ref_logprobs=None,
        rollout_logprobs=on(r.rollout_logprobs),
        is_weights=None,
        sample_ids=on(g.sample_ids),
        group_ids=on(g.group_ids),
    )


class Update(NamedTuple):
    """One optimizer update: its phase's loss mask, its rows and their micro-batches."""

    phase: Tensor  # [N, T] loss mask of the update's phase (the batch's loss mask without phases)
    rows: Tensor  # [n] batch rows of the mini-batch
    micro: list[Tensor]  # positions within `rows` of each micro-batch (one backward pass each)


def row_layout(n_rows: int, mini_batches: int, grad_accum: int, device=None) -> list[list[Tensor]]:
    """Rows 0..n-1 cut into `mini_batches` contiguous mini-batches, each into up to `grad_accum` non-empty
    micro-batches (row index tensors). A mini-batch is empty when there are fewer rows than mini-batches."""
    out = []
    for rows in torch.arange(n_rows, device=device).tensor_split(mini_batches):
        out.append([m for m in rows.tensor_split(grad_accum) if m.numel()])
    return out


def score_chunks(layout: list[list[Tensor]]) -> list[Tensor]:
    """Every row once, in the micro-batches of the first sweep: pi_old scored in these chunks is bitwise the
    loss pass's log pi of the first update."""
    return [m for mini in layout for m in mini]


def plan_updates(layout: list[list[Tensor]], phases: list[Tensor], num_iterations: int) -> list[Update]:
    """The step's optimizer updates in order: phase > epoch > mini-batch."""
    plan = []
    for phase in phases:
        for _ in range(num_iterations):
            for mini in layout:
                rows = torch.cat(mini) if mini else torch.zeros(0, dtype=torch.long)
                start = int(rows[0]) if rows.numel() else 0
                plan.append(Update(phase, rows, [m - start for m in mini]))
    return plan


def slice_weights(w: TokenWeights, idx: Tensor) -> TokenWeights:
    """The rows `idx` of every [N, T] field of `w` (phases are dropped: they were applied up front)."""
    kw = {f.name: getattr(w, f.name) for f in fields(w) if f.name != "phases"}
    return TokenWeights(**{k: (None if v is None else v[idx]) for k, v in kw.items()})


def update_weights(
    rule: WeightingRule,
    params: dict,
    b: Batch,
    rows: Tensor,
    current: Tensor | None,
) -> TokenWeights | None:
    """The update's weights over its rows ([n, T] fields), from `current` = log pi at the start of the
    update ([N, T]); None for pointwise rules, which are evaluated on each micro-batch's live log pi (the
    same numbers: a pointwise weight needs no batch statistic)."""
    if rule.pointwise or rows.numel() == 0:
        return None
    if current is None:
        raise ValueError("a rule with batch statistics needs the log-probs at the start of the update")
    tb = TokenBatch(
        logprobs=current[rows],
        old_logprobs=b.old_logprobs[rows],
        advantages=b.advantages[rows],
        mask=b.loss_mask[rows],
    )
    return rule(tb, **params)
