"""The built-in GRPO / TR-GRPO trainer: a readable loop of setup(), step() and train().

    tokengrad train configs/tiny_charset.toml steps=20 weighting=tr_grpo
    run_dir = tokengrad.train("configs/tiny_charset.toml", steps=20, weighting="tr_grpo")

One step (GRPO, arXiv 2402.03300, with DAPO's options, arXiv 2503.14476):
  1. generate  B prompts x G sampled completions at temperature T; tool tasks get their tool turns; with
               dynamic sampling, more rounds until B informative groups (tokengrad.train.sampling)
                                                                                      -> time_generate
  2. score     verifiable rewards, group-relative advantages, log pi_old of the rollout policy and log
               pi_ref of the frozen initial model, both through the loss's own log-prob function
               (tokengrad.train.policy: softmax(z / T)); when the step is one on-policy update, log pi_old
               is the loss pass's own, with no pass here (updates.reuses_old_logprobs) -> time_score
  3. update    for each phase the weighting rule declares (one, or Lopti's low-probability tokens then
               the rest, arXiv 2505.12929), each of num_iterations epochs and each of mini_batches row
               subsets: one AdamW update built from grad_accum micro-batches, after gradient clipping
               (tokengrad.train.updates.GRPOUpdate, built from the config by
               tokengrad.train.settings)                                              -> time_update
Every pass goes through the tokengrad Recorder, which writes the run format (see tokengrad.schema).

Under torchrun / accelerate launch (`torchrun --nproc_per_node 2 -m tokengrad.cli train CONFIG`) each process
samples and trains an equal share of every step's prompt groups in DistributedDataParallel, its loss weighted
so that the update equals one process on the whole batch (batch statistics of the rules are taken per rank).
Logged scalars are global; rank 0 writes evals and checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch
from tqdm.auto import tqdm

from tokengrad.objective.weighting import check_rule
from tokengrad.record.store import claim as run_claim
from tokengrad.train import batch as tb
from tokengrad.train import correction
from tokengrad.train import distributed as dist
from tokengrad.train.checkpoint import checkpoint_after_step, checkpoint_path, resolve_run_dir, resume_state
from tokengrad.train.config import TrainConfig, load_config, make_config
from tokengrad.train.dead_steps import DeadSteps
from tokengrad.train.doctoring import TrainerDoctor
from tokengrad.train.generation import (
    evaluate,
    generate_completions,
    render_prompt,
    sampling_kwargs,
    score_completions,
)
from tokengrad.train.models import load_model
from tokengrad.train.policy import (
    logprob_temperature,
    policy_forward,
)
from tokengrad.train.sampling import Gathered, gather_rollout, rollout_stats, sample_rows
from tokengrad.train.settings import recorder_of, update_of, weighting_of
from tokengrad.train.tasks import get_task
from tokengrad.train.updates import Policy, adamw


class Trainer:
    """GRPO with a pluggable token-weighting rule; `Trainer(cfg).setup().train()` returns the run dir."""

    def __init__(self, config: TrainConfig):
        self.cfg = config

    # ---- setup ------------------------------------------------------------------------------------
    def setup(self) -> "Trainer":
        cfg = self.cfg
        self.device = dist.process_device(cfg.device)
        self.share = dist.shard(cfg.prompts_per_step, "prompts_per_step")  # this rank's prompts of a step
        self.owns_group = dist.init_from_env(self.device)
        self.run_dir = dist.on_main(lambda: resolve_run_dir(cfg))  # one name (and check) for all ranks
        # This rank's claim on the run directory before any work (a second trainer, or a --resume while
        # this one runs, is refused here); the Recorder records under it and releases it when it closes.
        self.claim = run_claim.take(self.run_dir, dist.rank())
        try:
            return self._setup_run()
        except BaseException:
            self.claim.release()
            raise

    def _setup_run(self) -> "Trainer":
        cfg = self.cfg
        self.task = get_task(cfg.task, **cfg.task_params)  # bad task params fail before the model loads
        self.weighting = weighting_of(cfg)
        self.correction = correction.correction_of(cfg)  # None: rollout_correction = "off"
        for msg in check_rule(
            cfg.weighting, cfg.weighting_params, eps_low=cfg.eps_low, eps_high=cfg.eps_high
        ):
            warnings.warn(msg, UserWarning, stacklevel=2)
        # log-probs of the policy being trained describe the distribution the sampler draws from
        self.temperature = logprob_temperature(cfg.temperature)
        self._load_policy(resume_state(cfg, self.run_dir) if cfg.resume else None)
        self._draw_problems()
        policy = Policy(
            model=self.model,
            forward=self.policy,
            opt=self.opt,
            temperature=self.temperature,
            autocast=self.autocast,
            device=self.device,
        )
        self.updates = update_of(
            cfg, policy, weighting=self.weighting, correction=self.correction, max_len=self.max_len
        )
        self.doctor = TrainerDoctor(cfg.doctor)
        self.rec = recorder_of(
            cfg,
            self.run_dir,
            model=self.model,
            tokenizer=self.tok,
            weighting=self.weighting,
            temperature=self.temperature,
            start_step=self.start_step,
            doctor=self.doctor.options(),
            loss=self.updates.loss,
        )
        self.dead_steps = DeadSteps()  # steps without a gradient, by cause
        return self

    def _load_policy(self, state: dict | None) -> None:
        """The policy (from the checkpoint when resuming), its DDP-wrapped loss function, the frozen
        reference, the optimizer and the first step."""
        cfg = self.cfg
        source = str(checkpoint_path(self.run_dir) / "model") if state else cfg.model
        self.model, self.tok = load_model(source, seed=cfg.seed)
        # Dropout off for good: pi_old, the update's pi and the sampling policy must be one function.
        self.model.to(self.device).eval()
        # (logits, hidden) = self.policy(ids, attn, P) for the loss, in DDP under torchrun; generation uses
        # the model itself, scoring policy_forward on the model: the same function without the wrapper.
        self.policy = dist.wrap(dist.ModelFunction(policy_forward, self.model), self.device)
        # The reference is the initial policy, so a resumed run reloads it from the original model.
        if cfg.beta > 0:
            ref = load_model(cfg.model, seed=cfg.seed)[0] if state else copy.deepcopy(self.model)
        self.ref = _frozen(ref, self.device) if cfg.beta > 0 else None
        self.opt = adamw(self.model, cfg.lr, cfg.weight_decay)
        self.start_step = 0
        if state:
            self.opt.load_state_dict(state["optimizer"])
            self.start_step = state["step"] + 1

    def _draw_problems(self) -> None:
        """The training and held-out problems, and the longest completion (Dr. GRPO's constant)."""
        cfg = self.cfg
        # Tasks draw problems as a seeded stream, so a longer pool (a resumed run with more steps) starts
        # with the same problems as a shorter one.
        self.problems = self.task.train_problems(
            cfg.n_train_problems or cfg.prompts_per_step * cfg.steps * self.rounds, cfg.seed
        )
        self.eval_problems = (
            self.task.eval_problems(cfg.eval_per_difficulty, cfg.seed) if cfg.eval_every else []
        )
        # Dr. GRPO divides by a constant: the most generated tokens a completion can hold.
        self.max_len = cfg.max_new_tokens * (cfg.max_turns if self.task.tool_stop else 1)

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
                if self.doctor.should_stop():  # a critical finding: stop cleanly after the last step
                    self.halt(step - 1)
                    break
                logged = self.step(step)
                bar.set_postfix(
                    reward=f"{logged['reward_mean']:.3f}", gnorm=f"{logged.get('grad_norm', math.nan):.3g}"
                )
                if self.evaluates_after(step):
                    self.evaluate(step)
                if self.saves_after(step):
                    self.save(step)
        if dist.is_main():
            print(self.dead_steps.closing_line(cfg.steps - self.start_step, self.run_dir), file=sys.stderr)
        return self.run_dir

    def halt(self, last: int) -> None:
        """The doctor's clean stop after step `last`: a checkpoint (with checkpoint=true) and one line."""
        if self.cfg.checkpoint and last >= self.start_step:
            self.save(last)
        f = self.doctor.finding
        where = f"after step {last}" if f is None else f"after step {last}: {f.id}: {f.message}"
        if dist.is_main():
            print(f"tokengrad: the doctor stopped the run {where}", file=sys.stderr)

    def evaluates_after(self, step: int) -> bool:
        """Held-out evaluation after every eval_every-th step and the last (eval_every = 0: none)."""
        n, last = self.cfg.eval_every, step == self.cfg.steps - 1
        return bool(n) and ((step + 1) % n == 0 or last)

    def saves_after(self, step: int) -> bool:
        """With checkpoint = true: after every checkpoint_every-th step (0: none) and the last."""
        n, last = self.cfg.checkpoint_every, step == self.cfg.steps - 1
        return self.cfg.checkpoint and (last or bool(n) and (step + 1) % n == 0)

    def save(self, step: int) -> None:
        """The checkpoint after `step`: every rank's rows of steps <= step reach disk first, then rank 0
        writes it."""
        checkpoint_after_step(
            self.rec,
            self.run_dir,
            step,
            model=self.model,
            tokenizer=self.tok,
            optimizer=self.opt,
            config=self.cfg.to_dict(),
        )

    def step(self, step: int) -> dict:
        """One rollout batch and its updates; returns the scalars logged to the steps table."""
        # Sampling depends on (seed, step, rank) only, so a resumed run repeats an uninterrupted one.
        torch.manual_seed((self.cfg.seed * 1_000_003 + step) * dist.world_size() + dist.rank())
        lr = self.set_lr(step)
        with self.rec.step(step) as st:
            t0 = time.perf_counter()
            cfg = self.cfg
            g = gather_rollout(
                lambda k: self.generate_round(step, k),
                self.task,
                self.tok,
                prompts=cfg.prompts_per_step,
                group_size=cfg.group_size,
                share=self.share,
                filter_groups=cfg.dynamic_sampling,
                max_rounds=self.rounds,
                adv_scale=cfg.adv_scale,
            )
            t1 = time.perf_counter()
            batch = self.score(g)
            t2 = time.perf_counter()
            logged = self.updates.run(st, batch, g.rollout).scalars()
            t3 = time.perf_counter()
            # the gap's and the correction's metrics over all ranks, once log pi_old is known (when the
            # update reuses it, from the loss pass)
            rollout = correction.step_metrics(batch, self.correction)
            logged.update(
                rollout_stats(g.scores),
                lr=lr,
                time_generate=t1 - t0,
                time_score=t2 - t1,
                time_update=t3 - t2,
                groups_generated=len(g.scores),
                groups_kept=g.n_kept,
                gen_rounds=g.n_rounds,
            )
            logged.update(rollout)  # the gap's metrics: none without a sampler log-prob (greedy, no rows)
            self.dead_steps.count(logged, g.scores)
            st.log(**logged)
            st.samples(
                **sample_rows(g, self.cfg.task, self.cfg.group_size),
                **correction.sample_columns(batch, g.in_update),
            )
        return logged

    def generate_round(self, step: int, k: int) -> tuple:
        """Round k of the step: this rank's completions, problems and (rewards, correct)."""
        problems = self.problems_for(step, k)
        with self.autocast():
            comps = generate_completions(
                self.model,
                self.tok,
                [render_prompt(self.tok, p) for p in problems],
                n_samples=self.cfg.group_size,
                max_new_tokens=self.cfg.max_new_tokens,
                sampling=self.sampling,
                task=self.task,
                max_turns=self.cfg.max_turns,
            )
        return comps, problems, score_completions(comps, self.task, problems)

    @torch.no_grad()
    def score(self, g: Gathered) -> tb.Batch | None:
        """The update batch of this rank (None if it holds no kept group) with log pi_old, log pi_ref and the
        rollout correction's weights. When the update reuses the loss pass's log-probs as log pi_old, they
        are NaN until that pass fills them."""
        b, u = tb.select_rows(g, self.device), self.updates
        if b is not None:  # the loss passes' own micro-batches, through the loss's own function
            ref = u.score_rows(self.ref, b) if self.ref is not None else None
            old = b.old_logprobs.fill_(math.nan) if u.reuses_old else u.score_rows(self.model, b)
            b = b._replace(old_logprobs=old, ref_logprobs=ref)  # [N, T] each
        return correction.with_weights(b, self.correction)

    def evaluate(self, step: int) -> dict:
        """Greedy accuracy on the held-out problems, per difficulty, into the evals table (each rank
        evaluates every world_size-th problem; rank 0 writes the summed counts)."""
        with self.autocast():
            cfg, mine = self.cfg, self.eval_problems[dist.rank() :: dist.world_size()]
            mine = evaluate(
                self.model,
                self.tok,
                self.task,
                problems=mine,
                max_new_tokens=cfg.eval_max_new_tokens or cfg.max_new_tokens,
                max_turns=cfg.max_turns,
                batch_size=cfg.prompts_per_step * cfg.group_size,
            )
        results = dist.merge_accuracies(mine, sorted({str(p.difficulty) for p in self.eval_problems}))
        for difficulty, (accuracy, n) in results.items() if dist.is_main() else ():
            self.rec.log_eval(step, task=self.cfg.task, difficulty=difficulty, accuracy=accuracy, n=n)
        return results

    # ---- helpers ----------------------------------------------------------------------------------
    @property
    def sampling(self) -> dict:
        return sampling_kwargs(self.cfg.temperature, self.cfg.top_p)

    @property
    def rounds(self) -> int:
        """Generation rounds a step may run (dynamic sampling's refills)."""
        return self.cfg.max_gen_batches if self.cfg.dynamic_sampling else 1

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

    def problems_for(self, step: int, round_: int = 0) -> list:
        """This rank's share of the prompts of generation round `round_` of the step (all of them in one
        process); a function of (step, round) alone, so a resumed run draws the same prompts."""
        B, pool = self.cfg.prompts_per_step, self.problems
        first = (step * self.rounds + round_) * B
        return [pool[(first + j) % len(pool)] for j in range(B)][self.share]


def _frozen(model, device) -> torch.nn.Module:
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# ---- entry points ---------------------------------------------------------------------------------
def train(
    config_or_path: str | os.PathLike | TrainConfig | Mapping[str, Any] | None = None, **overrides
) -> Path:
    """Run the trainer; returns the run directory. `config_or_path`: a TOML/YAML path, a TrainConfig, a dict
    of keys, or None (defaults); keyword overrides win, e.g. `train("configs/tiny_charset.toml", steps=2)`."""
    if isinstance(config_or_path, TrainConfig):
        cfg = make_config({**config_or_path.to_dict(), **overrides})
    elif isinstance(config_or_path, Mapping):
        cfg = load_config(None, {**config_or_path, **overrides})
    else:
        cfg = load_config(config_or_path, overrides)
    return Trainer(cfg).setup().train()
