"""The optimizer updates of one training step: the plan (Lopti's phases > epochs > mini-batches), the
backward passes of each update (grad_accum micro-batches), and the loss pass of one micro-batch (forward,
weighting rule, the GRPO loss of tokengrad.objective.loss, backward), each tracked by the recorder.

log pi_old comes from the trainer's no-grad scoring pass, or, when the step is one on-policy update
(`reuses_old_logprobs`), from the loss pass itself: there pi_theta is pi_old, so its detached log-probs are
log pi_old and the scoring forward is skipped.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokengrad.objective.gradient_scale import unsupported_fields
from tokengrad.objective.loss import micro_batch_share, normaliser, phase_masks, policy_loss
from tokengrad.objective.weighting import TokenBatch
from tokengrad.train import batch as tb
from tokengrad.train import correction
from tokengrad.train import distributed as dist
from tokengrad.train.policy import directional_logprobs, score_logprobs, token_logprobs
from tokengrad.train.sampling import Gathered


def reuses_old_logprobs(cfg, rule, rule_params: dict) -> bool:
    """Whether the loss pass's own detached log-probs stand in for log pi_old, skipping the scoring pass.

    Exact when every row's first loss forward runs at the parameters that sampled the rollout and nothing
    reads log pi_old before it. GRPO with one update per rollout (mu = 1) has pi_old = pi_theta (arXiv
    2402.03300), and TRL takes the same shortcut (with num_iterations == 1 and steps_per_generation ==
    gradient_accumulation_steps, old_per_token_logps = per_token_logps.detach()). Here that is:
      - one optimizer update per step: num_iterations = 1 and mini_batches = 1 (a second epoch, or a second
        mini-batch, runs after an optimizer step) and a rule without phases (Lopti also splits the rows
        on p_old before the first pass);
      - a pointwise rule: a rule with batch statistics needs log pi over the update's rows up front;
      - rollout_correction off: its IS weights need log pi_old before the loss.
    The recorded old_logprob, ratio (exactly 1), coef and loss are those of the scoring pass: the same rows
    in the same micro-batches through the same function (tokengrad.train.policy)."""
    return bool(
        cfg.reuse_old_logprobs
        and cfg.num_iterations == 1
        and cfg.mini_batches == 1
        and cfg.rollout_correction == "off"
        and getattr(rule, "pointwise", False)
        and "phases" not in unsupported_fields(cfg.weighting, rule_params)  # rule on a probe batch
    )


def applied_updates(opt: torch.optim.Optimizer) -> int:
    """The version of the weights: how many optimizer updates have been applied, read from the optimizer's
    own step count (AdamW keeps one per parameter), so a resumed run continues it from its checkpoint.
    The sampler of a step is the trainer at the step's start (no delayed rollouts), so this count before
    the first update is the version that sampled every sequence of the step (tokens.policy_version)."""
    steps = [float(st["step"]) for st in opt.state.values() if "step" in st]
    return int(max(steps)) if steps else 0


class Updates:
    """The update half of `Trainer` (a mixin: it reads the trainer's cfg, model, policy, rule, optimizer and
    reuse_old, the value of `reuses_old_logprobs`)."""

    def update(self, st, b: tb.Batch | None, g: Gathered) -> dict:
        """The step's optimizer updates (phase > epoch > mini-batch), each built from grad_accum backward
        passes (micro-batches). Returns global scalars."""
        cfg, plan = self.cfg, self.plan(b)
        # Every rank must join every gradient all-reduce, also one whose groups dynamic sampling all dropped.
        n_updates, any_idle = (int(x) for x in dist.all_reduce([len(plan), b is None], "max"))
        if n_updates == 0:
            return {"n_updates": 0}
        st.is_bucket_step = st.is_bucket_step and not any_idle  # bucket all-reduces need every rank's buckets
        self.sampled_version = applied_updates(self.opt)  # update k runs at version sampled_version + k
        losses, kls, norms = [], [], []
        for update_id in range(n_updates):
            parts = self.backward_passes(st, b, plan[update_id] if b is not None else None, update_id, g)
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
        if st.is_bucket_step:  # how the step's updates moved the probabilities of its loss tokens
            st.record_prob_change(self.score_rows(self.model, b), sample_ids=b.sample_ids)
        loss, kl, n_kl = dist.all_reduce([sum(losses), sum(kls), len(kls)]).tolist()
        out = {"loss": loss / dist.world_size() / n_updates, "grad_norm": max(norms), "n_updates": n_updates}
        if cfg.beta > 0:
            out["kl"] = kl / max(n_kl, 1)
        return out

    def backward_passes(self, st, b: tb.Batch | None, u: tb.Update | None, update_id: int, g: Gathered):
        """The backward passes of one optimizer update on this rank; [(loss, kl)] per micro-batch."""
        rows = u.rows if u is not None else torch.zeros(0, dtype=torch.long)
        local = normaliser(self.cfg.aggregation, b.loss_mask[rows]) if rows.numel() else 0.0
        rank_scale = dist.rank_scale(local)  # collective: every rank, every update
        if not rows.numel():  # zeros into the all-reduce: one row's forward, times 0
            r = g.rollout
            ids, attn = r.input_ids[:1].to(self.device), r.attention_mask[:1].to(self.device)
            return dist.idle_backward(self.policy, ids, attn, r.prompt_len)
        # log pi at the start of the update, for rules with batch statistics: pi_old itself (bitwise) before
        # the first optimizer step, else one no-grad pass in the loss's own micro-batches
        current = b.old_logprobs if update_id == 0 else None
        if current is None and not getattr(self.rule, "pointwise", False):
            current = self.score_rows(self.model, b, [rows[m] for m in u.micro])
        weights = tb.update_weights(self.rule, self.rule_params, b, rows, current)
        # under DDP only the last micro-batch's backward all-reduces the gradients
        return [
            self.loss_pass(st, b, u, m, weights, update_id, rank_scale, i == len(u.micro) - 1)
            for i, m in enumerate(u.micro)
        ]

    def plan(self, b: tb.Batch | None) -> list[tb.Update]:
        """The step's optimizer updates; none without rows."""
        if b is None:
            return []
        if self.reuse_old:  # no phases (reuses_old_logprobs), and pi_old is not known yet
            phases = [b.loss_mask]
        else:  # Phases (Lopti) are fixed from pi_old for the whole step, so they are found once, up front.
            first = self.rule(
                TokenBatch(b.old_logprobs, b.old_logprobs, b.advantages, b.loss_mask), **self.rule_params
            )
            phases = phase_masks(first, b.loss_mask)  # each [N, T]
        return tb.plan_updates(self.layout(len(b.sample_ids)), phases, self.cfg.num_iterations)

    def loss_pass(
        self,
        st,
        b: tb.Batch,
        u: tb.Update,
        micro: Tensor,
        weights,
        update_id: int,
        rank_scale: float = 1.0,
        sync: bool = True,
    ) -> tuple[float, float]:
        """Forward, weighting rule, GRPO loss and backward of one micro-batch (positions `micro` within the
        update's rows); returns (loss, kl). `weights`: the update's weights over its rows (None: the rule
        is pointwise and runs here). `rank_scale`: this rank's `dist.rank_scale`; `sync`: the backward
        all-reduces (DDP)."""
        cfg, rows = self.cfg, u.rows[micro]
        with dist.sync_grads(self.policy, sync):  # DDP decides in the forward
            # log pi and the recorder's softmax statistics from one pass over the vocabulary
            logprobs, stats, hidden = token_logprobs(
                self.policy,
                b.input_ids[rows],
                b.attention_mask[rows],
                b.prompt_len,
                b.completion_ids[rows],
                self.temperature,
                self.autocast,
            )  # [n, T]
        if self.reuse_old:  # the rows' one pass, before any optimizer step: log pi here is log pi_old
            b.old_logprobs[rows] = logprobs.detach()  # [n, T], read after the loss by the step's metrics
        old, adv, loss_mask = b.old_logprobs[rows], b.advantages[rows], b.loss_mask[rows]
        ref = b.ref_logprobs[rows] if b.ref_logprobs is not None else None
        if weights is None:
            w = self.rule(TokenBatch(logprobs, old, adv, loss_mask), **self.rule_params)
            if self.reuse_old and w.phases is not None:  # the probe in reuses_old_logprobs saw none
                raise ValueError(f"rule {cfg.weighting!r} returned phases; set reuse_old_logprobs = false")
        else:
            w = tb.slice_weights(weights, micro)
        out = policy_loss(
            logprobs,
            old,
            adv,
            u.phase[rows],
            w,
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            beta=cfg.beta,
            ref_logprobs=ref,
            aggregation=cfg.aggregation,
            max_len=self.max_len,
            norm_mask=loss_mask,
            ppo_clip=getattr(self.rule, "ppo_clip", True),
            clip_ratio_c=cfg.clip_ratio_c,
            is_weight=None if b.is_weights is None else b.is_weights[rows].expand_as(logprobs),
        )
        self.track_pass(st, b, u, rows, logprobs, stats, hidden, w, out.clipped, update_id)
        share = micro_batch_share(cfg.aggregation, loss_mask, b.loss_mask[u.rows]) * rank_scale
        st.backward(out.loss * share)
        return out.loss.item() * share, out.metrics["kl_mean"]

    def track_pass(self, st, b: tb.Batch, u: tb.Update, rows, logprobs, stats, hidden, w, clipped, update_id):
        """The recorder's view of one loss pass: its log-probs and everything the token rows need."""
        old, adv = b.old_logprobs[rows], b.advantages[rows]
        ref = b.ref_logprobs[rows] if b.ref_logprobs is not None else None
        version = getattr(self, "sampled_version", None)  # set by update()
        st.track(
            logprobs,
            token_ids=b.completion_ids[rows],
            mask=b.mask[rows],
            loss_mask=u.phase[rows],
            old_logprobs=old,
            ref_logprobs=ref,
            advantages=adv,
            weights=w.effective(logprobs),
            sample_ids=b.sample_ids[rows],
            group_ids=b.group_ids[rows],
            stats=stats,
            hidden=hidden,
            clipped=clipped,
            update_id=update_id,
            policy_versions=version,
            trainer_version=None if version is None else version + update_id,  # one opt.step() per update
            rollout_logprobs=b.rollout_logprobs[rows],
            **correction.token_columns(b, rows, u.phase[rows], self.correction),
            recompute=lambda: directional_logprobs(  # attribution's second look at the same rows
                self.model,
                b.input_ids[rows],
                b.attention_mask[rows],
                b.prompt_len,
                b.completion_ids[rows],
                self.temperature,
                self.autocast,
                entropy=self.cfg.attribute_entropy,  # the pair (log pi, H) for entropy attribution
            ),
        )

    def layout(self, n_rows: int) -> list[list[Tensor]]:
        return tb.row_layout(n_rows, self.cfg.mini_batches, self.cfg.grad_accum, self.device)

    def score_rows(self, model, b: tb.Batch, chunks: list[Tensor] | None = None) -> Tensor:
        """[N, T] log pi of the batch under `model` (rows in `chunks`, default all in the loss's chunks)."""
        chunks = chunks if chunks is not None else tb.score_chunks(self.layout(len(b.sample_ids)))
        return score_logprobs(
            model,
            b.input_ids,
            b.attention_mask,
            b.prompt_len,
            b.completion_ids,
            chunks,
            self.temperature,
            self.autocast,
        )
