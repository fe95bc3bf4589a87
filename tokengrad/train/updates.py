"""The optimizer updates of one training step, as one object built from named settings.

    updates = GRPOUpdate(policy, weighting, loss=LossSettings(...), schedule=Schedule(...))
    stats = updates.run(st, batch, rollout)       # UpdateStats(loss, grad_norm, n_updates, kl)
    st.log(**stats.scalars())

The step's updates follow the plan (the rule's phases > epochs > mini-batches, tokengrad.train.batch); each
update is built from grad_accum loss passes (forward, weighting rule, the GRPO loss of
tokengrad.objective.loss, backward; one `PassResult` each), all tracked by the step's recorder. The settings
are plain values taken from the trainer's config (`tokengrad.train.settings`); nothing here reads the config.

log pi_old comes from the trainer's no-grad scoring pass, or, when the step is one on-policy update
(`reuses_old_logprobs`), from the loss pass itself: there pi_theta is pi_old, so its detached log-probs are
log pi_old and the scoring forward is skipped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, ContextManager, NamedTuple

import torch
from torch import Tensor

from tokengrad.objective.loss import micro_batch_share, normaliser, phase_masks, policy_loss
from tokengrad.objective.rule_contract import WeightingRule
from tokengrad.objective.weighting import TokenBatch
from tokengrad.train import batch as tb
from tokengrad.train import correction as rc
from tokengrad.train import distributed as dist
from tokengrad.train.policy import directional_logprobs, score_logprobs, token_logprobs


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The model being trained, its optimizer, and how its log-probs are computed."""

    model: torch.nn.Module  # scoring, attribution's recompute and the probability change
    forward: Callable  # (logits, hidden) = forward(ids, attn, P): the loss's function (DDP under torchrun)
    opt: torch.optim.Optimizer
    temperature: float  # every log-prob is of softmax(z / T), the sampler's distribution
    autocast: Callable[[], ContextManager]  # bf16 autocast, or a null context
    device: torch.device


class Weighting(NamedTuple):
    """The token-weighting rule and its parameters (tokengrad.objective.weighting)."""

    rule: WeightingRule
    params: dict


@dataclass(frozen=True, kw_only=True)
class LossSettings:
    """The GRPO loss of every pass: the keywords of tokengrad.objective.loss.policy_loss."""

    eps_low: float  # the ratio's clip range is [1 - eps_low, 1 + eps_high]
    eps_high: float
    beta: float  # k3 KL coefficient to pi_ref (0: no reference)
    aggregation: str  # a registered aggregation: "grpo", "dapo", "dr_grpo", ...
    clip_ratio_c: float  # dual-clip bound for A < 0 (0: off; arXiv 1912.09729)
    max_len: int  # Dr. GRPO's constant: the most generated tokens a completion can hold


class Schedule(NamedTuple):
    """How a step's rows become optimizer updates (tokengrad.train.batch)."""

    num_iterations: int  # PPO epochs over the step's rows
    mini_batches: int  # disjoint row subsets per epoch, one optimizer update each
    grad_accum: int  # micro-batches (backward passes) per update
    grad_clip: float  # clip each update's gradient norm to this (0: no clipping)


class PassResult(NamedTuple):
    """One loss pass (one micro-batch's backward)."""

    loss: float  # its share of the update's loss, times this rank's share
    kl: float  # mean k3 KL to pi_ref over its tokens


class UpdateStats(NamedTuple):
    """The step's updates, over all ranks; None where the step had no update."""

    loss: float | None  # the update's loss, mean over the step's updates
    grad_norm: float | None  # the largest norm before clipping of the step's updates
    n_updates: int
    kl: float | None  # mean k3 KL over the passes (None when beta = 0)

    def scalars(self) -> dict:
        """The steps-table scalars: those that are set."""
        return {k: v for k, v in self._asdict().items() if v is not None}


class _At(NamedTuple):
    """Where a pass sits: the update it feeds and the versions of the weights."""

    update_id: int  # the optimizer update within the step
    sampled_version: int  # updates applied before the step: the version that sampled its rows
    rank_scale: float  # this rank's `dist.rank_scale` of the update


def reuses_old_logprobs(wanted: bool, schedule: Schedule, weighting: Weighting, correction) -> bool:
    """Whether the loss pass's own detached log-probs stand in for log pi_old, skipping the scoring pass.

    Exact when every row's first loss forward runs at the parameters that sampled the rollout and nothing
    reads log pi_old before it. GRPO with one update per rollout (mu = 1) has pi_old = pi_theta (arXiv
    2402.03300), and TRL takes the same shortcut (with num_iterations == 1 and steps_per_generation ==
    gradient_accumulation_steps, old_per_token_logps = per_token_logps.detach()). Here that is:
      - one optimizer update per step: num_iterations = 1 and mini_batches = 1 (a second epoch, or a second
        mini-batch, runs after an optimizer step) and a rule that declares no phases (Lopti splits the rows
        on p_old before the first pass);
      - a pointwise rule: a rule with batch statistics needs log pi over the update's rows up front;
      - no rollout correction (`correction` None): its IS weights need log pi_old before the loss.
    The recorded old_logprob, ratio (exactly 1), coef and loss are those of the scoring pass: the same rows
    in the same micro-batches through the same function (tokengrad.train.policy)."""
    rule, params = weighting
    return bool(
        wanted
        and schedule.num_iterations == 1
        and schedule.mini_batches == 1
        and correction is None
        and rule.pointwise
        and not rule.has_phases(params)
    )


def adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (arXiv 1711.05101) over the model's parameters, fused where torch has the kernel for all of
    them: one kernel over every tensor instead of a Python loop of small ops per parameter (on CPU the
    loop is what torch picks by default). TRL's default optimizer (`adamw_torch_fused`) is the same."""
    params = list(model.parameters())
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except RuntimeError:  # a device or dtype without the fused kernel: torch's default implementation
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def applied_updates(opt: torch.optim.Optimizer) -> int:
    """The version of the weights: how many optimizer updates have been applied, read from the optimizer's
    own step count (AdamW keeps one per parameter), so a resumed run continues it from its checkpoint.
    The sampler of a step is the trainer at the step's start (no delayed rollouts), so this count before
    the first update is the version that sampled every sequence of the step (tokens.policy_version)."""
    steps = [float(st["step"]) for st in opt.state.values() if "step" in st]
    return int(max(steps)) if steps else 0


class GRPOUpdate:
    """A step's optimizer updates for one policy, rule, loss and schedule; `run` returns `UpdateStats`.

    Args:
        policy: the model, its loss function, optimizer, temperature and autocast.
        weighting: the rule and its parameters; what the rule declares (phases, pointwise) shapes the plan.
        loss: the GRPO loss's settings.
        schedule: epochs, mini-batches, micro-batches and the gradient clip.
        correction: the rollout correction (tokengrad.train.correction), None when off.
        reuse_old_logprobs: take log pi_old from the loss pass where that is exact (`reuses_old_logprobs`);
            `self.reuses_old` says whether it is, and the trainer then leaves log pi_old NaN.
        attribute_entropy: attribution's recompute also returns the entropy.
    """

    def __init__(
        self,
        policy: Policy,
        weighting: Weighting,
        loss: LossSettings,
        schedule: Schedule,
        *,
        correction=None,
        reuse_old_logprobs: bool = False,
        attribute_entropy: bool = False,
    ):
        self.policy, self.weighting, self.loss, self.schedule = policy, weighting, loss, schedule
        self.correction, self.attribute_entropy = correction, attribute_entropy
        self.reuses_old = reuses_old_logprobs(reuse_old_logprobs, schedule, weighting, correction)

    def run(self, st, b: tb.Batch | None, rollout) -> UpdateStats:
        """The step's optimizer updates (phase > epoch > mini-batch), each from grad_accum backward passes;
        `b` is this rank's update batch (None: no kept group), `rollout` the step's generated rows."""
        plan = self.plan(b)
        # Every rank must join every gradient all-reduce, also one whose groups dynamic sampling all dropped.
        n_updates, any_idle = (int(x) for x in dist.all_reduce([len(plan), b is None], "max"))
        if n_updates == 0:
            return UpdateStats(loss=None, grad_norm=None, n_updates=0, kl=None)
        if any_idle:  # the bucket all-reduces need every rank's buckets
            st.bucket_passes.skip()
        version = applied_updates(self.policy.opt)  # update k runs at version + k
        losses, kls, norms = [], [], []
        for update_id in range(n_updates):
            u = plan[update_id] if b is not None else None
            passes = self.backward_passes(st, b, u, update_id=update_id, version=version, rollout=rollout)
            losses.append(sum(p.loss for p in passes))
            kls += [p.kl for p in passes]
            norms.append(self.clip_and_step(st, update_id))
        if st.bucket_passes.scheduled:  # how the step's updates moved the probabilities of its loss tokens
            st.record_prob_change(self.score_rows(self.policy.model, b), sample_ids=b.sample_ids)
        loss_sum, kl, n_kl = dist.all_reduce([sum(losses), sum(kls), len(kls)]).tolist()
        return UpdateStats(
            loss=loss_sum / dist.world_size() / n_updates,
            grad_norm=max(norms),
            n_updates=n_updates,
            kl=kl / max(n_kl, 1) if self.loss.beta > 0 else None,
        )

    def clip_and_step(self, st, update_id: int) -> float:
        """Records the update's norms before clipping, clips with that same norm (gradients read once),
        steps the optimizer; returns the norm."""
        clip = self.schedule.grad_clip
        norm = st.clip_grad_norm_(clip, update_id) if clip > 0 else st.record_grad_norms(update_id)
        self.policy.opt.step()
        self.policy.opt.zero_grad(set_to_none=True)
        return norm

    def backward_passes(
        self, st, b: tb.Batch | None, u: tb.Update | None, *, update_id: int, version: int, rollout
    ) -> list[PassResult]:
        """The backward passes of one optimizer update on this rank."""
        rows = u.rows if u is not None else torch.zeros(0, dtype=torch.long)
        local = normaliser(self.loss.aggregation, b.loss_mask[rows]) if rows.numel() else 0.0
        at = _At(update_id, version, dist.rank_scale(local))  # rank_scale: collective, every rank
        if not rows.numel():  # zeros into the all-reduce: one row's forward, times 0
            ids, attn = (x[:1].to(self.policy.device) for x in (rollout.input_ids, rollout.attention_mask))
            return dist.idle_backward(self.policy.forward, ids, attn, rollout.prompt_len)  # no PassResult
        rule, params = self.weighting
        # log pi at the start of the update, for rules with batch statistics: pi_old itself (bitwise) before
        # the first optimizer step, else one no-grad pass in the loss's own micro-batches
        current = b.old_logprobs if update_id == 0 else None
        if current is None and not rule.pointwise:
            current = self.score_rows(self.policy.model, b, [rows[m] for m in u.micro])
        weights = tb.update_weights(rule, params, b, rows, current)
        # under DDP only the last micro-batch's backward all-reduces the gradients
        return [
            self.loss_pass(st, b, u, micro=m, weights=weights, at=at, sync=i == len(u.micro) - 1)
            for i, m in enumerate(u.micro)
        ]

    def plan(self, b: tb.Batch | None) -> list[tb.Update]:
        """The step's optimizer updates; none without rows."""
        if b is None:
            return []
        rule, params = self.weighting
        phases = [b.loss_mask]
        if rule.has_phases(params):  # Lopti's phases, fixed from pi_old for the whole step: found up front
            first = rule(
                TokenBatch(
                    logprobs=b.old_logprobs,
                    old_logprobs=b.old_logprobs,
                    advantages=b.advantages,
                    mask=b.loss_mask,
                ),
                **params,
            )
            phases = phase_masks(first, b.loss_mask)  # each [N, T]
        return tb.plan_updates(self.layout(len(b.sample_ids)), phases, self.schedule.num_iterations)

    def loss_pass(
        self, st, b: tb.Batch, u: tb.Update, *, micro: Tensor, weights, at: _At, sync: bool
    ) -> PassResult:
        """Forward, weighting rule, GRPO loss and backward of one micro-batch (positions `micro` within the
        update's rows). `weights`: the update's weights over its rows (None: the rule is pointwise and runs
        here); `sync`: this backward all-reduces the gradients (DDP)."""
        p, rows = self.policy, u.rows[micro]
        with dist.sync_grads(p.forward, sync):  # DDP decides in the forward
            # log pi and the recorder's softmax statistics from one pass over the vocabulary
            logprobs, stats, hidden = token_logprobs(
                p.forward,
                b.input_ids[rows],
                attention_mask=b.attention_mask[rows],
                prompt_len=b.prompt_len,
                completion_ids=b.completion_ids[rows],
                temperature=p.temperature,
                autocast=p.autocast,
            )  # [n, T]
        if self.reuses_old:  # the rows' one pass, before any optimizer step: log pi here is log pi_old
            b.old_logprobs[rows] = logprobs.detach()  # [n, T], read after the loss by the step's metrics
        old, adv, loss_mask = b.old_logprobs[rows], b.advantages[rows], b.loss_mask[rows]
        rule, params = self.weighting
        if weights is None:
            w = rule(
                TokenBatch(logprobs=logprobs, old_logprobs=old, advantages=adv, mask=loss_mask), **params
            )
        else:
            w = tb.slice_weights(weights, micro)
        out = policy_loss(
            logprobs,
            old,
            adv,
            u.phase[rows],
            w,
            ref_logprobs=b.ref_logprobs[rows] if b.ref_logprobs is not None else None,
            loss_mask=loss_mask,
            ppo_clip=rule.ppo_clip,
            is_weight=None if b.is_weights is None else b.is_weights[rows].expand_as(logprobs),
            **asdict(self.loss),
        )
        self.track_pass(
            st, b, u, rows=rows, scored=(logprobs, stats, hidden), w=w, clipped=out.clipped, at=at
        )
        share = micro_batch_share(self.loss.aggregation, loss_mask, b.loss_mask[u.rows]) * at.rank_scale
        st.backward(out.loss * share)
        return PassResult(loss=out.loss.item() * share, kl=out.metrics["kl_mean"])

    def track_pass(self, st, b: tb.Batch, u: tb.Update, *, rows, scored: tuple, w, clipped, at: _At) -> None:
        """The recorder's view of one loss pass: its log-probs (`scored`: log pi, softmax statistics and
        the head's input) and everything the token rows need."""
        logprobs, stats, hidden = scored
        p = self.policy
        st.track(
            logprobs,
            token_ids=b.completion_ids[rows],
            mask=b.mask[rows],
            loss_mask=u.phase[rows],
            old_logprobs=b.old_logprobs[rows],
            ref_logprobs=b.ref_logprobs[rows] if b.ref_logprobs is not None else None,
            advantages=b.advantages[rows],
            weights=w.effective(logprobs),
            sample_ids=b.sample_ids[rows],
            group_ids=b.group_ids[rows],
            stats=stats,
            hidden=hidden,
            clipped=clipped,
            update_id=at.update_id,
            policy_versions=at.sampled_version,
            trainer_version=at.sampled_version + at.update_id,  # one opt.step() per update
            rollout_logprobs=b.rollout_logprobs[rows],
            **rc.token_columns(b, rows, u.phase[rows], self.correction),
            recompute=lambda: directional_logprobs(  # attribution's second look at the same rows
                p.model,
                b.input_ids[rows],
                attention_mask=b.attention_mask[rows],
                prompt_len=b.prompt_len,
                completion_ids=b.completion_ids[rows],
                temperature=p.temperature,
                autocast=p.autocast,
                entropy=self.attribute_entropy,  # the pair (log pi, H) for entropy attribution
            ),
        )

    def layout(self, n_rows: int) -> list[list[Tensor]]:
        s = self.schedule
        return tb.row_layout(n_rows, s.mini_batches, s.grad_accum, self.policy.device)

    def score_rows(self, model, b: tb.Batch, chunks: list[Tensor] | None = None) -> Tensor:
        """[N, T] log pi of the batch under `model` (rows in `chunks`, default all in the loss's chunks)."""
        chunks = chunks if chunks is not None else tb.score_chunks(self.layout(len(b.sample_ids)))
        p = self.policy
        return score_logprobs(
            model,
            b.input_ids,
            attention_mask=b.attention_mask,
            prompt_len=b.prompt_len,
            completion_ids=b.completion_ids,
            chunks=chunks,
            temperature=p.temperature,
            autocast=p.autocast,
        )
