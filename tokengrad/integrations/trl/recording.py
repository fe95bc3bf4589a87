"""The hooks on one TRL `GRPOTrainer` and the recorder they feed (`tokengrad.integrations.trl.attach`).

One tokengrad step is one TRL generation batch. Per micro-batch `compute_loss` gives the inputs, the
wrapped `_get_per_token_logps_and_entropies` the log-probs the loss is built from (coef by the autograd
hook), `accelerator.backward` the bucket passes, `accelerator.clip_grad_norm_` the norms before clipping
(clip.py), `training_step` each micro-batch's loss, the callback the optimizer-update boundaries, the
learning rate and TRL's logs (joined where TRL logs; the step's own scalars: step_values.py).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import TrainerCallback

from tokengrad.integrations.trl import rollout
from tokengrad.integrations.trl.clip import ClipNorms, loss_scale
from tokengrad.integrations.trl.deepspeed import DeepSpeedNorms, deepspeed_setup
from tokengrad.integrations.trl.fused import FusedCapture, fused_token_stats
from tokengrad.integrations.trl.logs import SUMMARY_KEYS, StepLogs, column
from tokengrad.integrations.trl.loss import ClipSettings, clipped_tokens
from tokengrad.integrations.trl.step_values import StepValues, micro_batch_values, reward_scalars
from tokengrad.objective.gradient_scale import token_weights
from tokengrad.record.recorder import Recorder
from tokengrad.record.stats import TokenStats

SAMPLE_KEY = "tokengrad_sample_id"  # [B] global completion index, carried through TRL's shuffle and split


@dataclass(kw_only=True)
class ScoredPass:
    """What TRL's log-prob call of one compute_loss gave, kept until the loss returns (TRL's masks are known
    then): the [B, T] log-probs with their graph, their statistics, the LM head's input and a function that
    scores the same micro-batch again (attribution steps)."""

    logprobs: torch.Tensor  # [B, T]
    stats: TokenStats | None
    hidden: torch.Tensor | None  # [B, T, D]
    recompute: Callable[[], torch.Tensor]


class TRLRecording:
    """The hooks on one trainer and the recorder they feed; `detach()`, called when `train()` returns or
    raises, ends the open step, closes the recorder and restores the trainer. A later `trainer.train()` on
    the same trainer continues the run (`_continue_on_next_train`): the recorder reopens and its steps
    follow the last one recorded, so the second training is not silently left out."""

    def __init__(self, trainer, recorder: Recorder, rule=None):
        self.trainer, self.recorder, self.rule = trainer, recorder, rule
        self.clip = ClipSettings.of(trainer)
        self.step = None  # the open tokengrad step (StepRecorder) or None
        self.next_step = 0
        self.update_id = 0
        self._accumulating = False  # micro-batches tracked since the last optimizer update
        self._norms_done = False
        self._logs = StepLogs()
        self.values = StepValues()  # the open step's own loss, lr, rewards, kl and clip share
        self._update_loss = None  # the open optimizer update's loss so far (summed over micro-batches)
        self._lr = None  # the learning rate of the update the optimizer just applied
        self._inputs = None  # compute_loss inputs while TRL computes the loss
        self._pending: ScoredPass | None = None  # this compute_loss call's log-probs, tracked when it returns
        self._masks: dict = {}  # TRL's off-policy and entropy masks of this compute_loss call
        self._scored = None  # (prompts, completions, completion_ids, rewards_per_func) of the batch
        self._patched: list[tuple[object, str, object]] = []
        self.norms = ClipNorms(self)  # the norms before clipping (sets _norms_done)
        self._fused = None
        self._callback = None
        self.bucket_activations = False  # attach(bucket_activations=True): no checkpointing on bucket steps

    def install(self) -> "TRLRecording":
        t = self.trainer
        self._fused = FusedCapture(t)  # fresh per install: a continued run hooks the head again
        self._patch(t, "train", self._train)
        self._patch(t, "compute_loss", self._compute_loss)
        self._patch(t, "training_step", self._training_step)
        self._patch(t, "_get_per_token_logps_and_entropies", self._per_token_logps)
        self._patch(t, "_generate_and_score_completions", self._generate_and_score)
        self._patch(t, "_calculate_rewards", self._calculate_rewards)
        self._patch(
            t, "get_off_policy_mask", lambda orig, *a, **k: self._keep("off_policy_mask", orig(*a, **k))
        )
        self._patch(
            t, "get_high_entropy_mask", lambda orig, *a, **k: self._keep("entropy_mask", orig(*a, **k))
        )
        self.norms.install()
        self._patch(t.accelerator, "backward", self._backward)
        if deepspeed_setup(t) is not None:  # norms through DeepSpeed's API: .grad is partitioned
            DeepSpeedNorms(self).install()
        self._fused.install()
        self._callback = _Callback(self)
        t.add_callback(self._callback)
        t._tokengrad_recording = self
        self.recorder.open()
        return self

    def detach(self, finished: bool = True) -> None:
        """End the open step, close the recorder (flushing its files; `finished=False`: training failed, the
        run is not marked finished) and restore the trainer; a pending continuation is dropped."""
        if self.recorder is None:
            self.stop_continuing()
            return
        try:
            if self.step is not None:
                self.recorder.end_step()
        finally:
            self.step = None
            self.recorder.close(finished=finished)
            for obj, name, old in reversed(self._patched):
                if old is None:
                    delattr(obj, name)
                else:
                    setattr(obj, name, old)
            self._patched = []
            self._fused.remove()
            self.trainer.remove_callback(self._callback)
            self.trainer._tokengrad_recording = None
            self.recorder = None

    def _patch(self, obj, name: str, fn) -> None:
        old = vars(obj).get(name)  # an instance attribute to restore, else None (the class method stays)
        orig = getattr(obj, name)
        self._patched.append((obj, name, old))
        setattr(obj, name, lambda *a, **k: fn(orig, *a, **k))

    def _train(self, orig, *a, **k):
        recorder = self.recorder
        try:
            out = orig(*a, **k)
        except BaseException:  # finished steps reach disk; a failed run is never marked finished
            self.detach(finished=False)
            self._continue_on_next_train(recorder)
            raise
        self.detach()
        self._continue_on_next_train(recorder)
        return out

    def _continue_on_next_train(self, recorder: Recorder) -> None:
        """Leave one wrapper on `trainer.train`: calling it again reopens the recorder and installs the
        hooks, so the new training's steps follow the last recorded one (TRL restarts its global_step)."""
        t = self.trainer

        def again(*a, **k):
            self.stop_continuing()
            self.recorder, self._logs, self._accumulating = recorder, StepLogs(), False
            self._update_loss = None
            announce(recorder, f"trainer.train() again: the run goes on from step {self.next_step}")
            self.install()
            return t.train(*a, **k)

        t.train = again
        t._tokengrad_continuation = self

    def stop_continuing(self) -> None:
        """Remove the wrapper `_continue_on_next_train` left (a new attach() or detach() replaces it)."""
        t = self.trainer
        if vars(t).get("_tokengrad_continuation") is self:
            del t.train, t._tokengrad_continuation

    # -- generation: one tokengrad step per generation batch ----------------------------------------
    def _generate_and_score(self, orig, inputs):
        if not self.trainer.model.training:  # evaluation batches are not recorded
            return orig(inputs)
        carried = None
        if self.step is not None:
            if self._accumulating:  # the optimizer update spans generation batches: its buckets go on
                passes = self.step.bucket_passes
                carried = (passes.scheduled, passes.take_open(self.update_id))
            self.recorder.end_step()
        self.step = self.recorder.begin_step(self._rollout_index())
        if carried is not None:
            self.step.bucket_passes.carry_on(*carried, update_id=0)
        self.next_step = self.step.step + 1
        self.update_id, self._norms_done, self._scored = 0, False, None
        self._logs = StepLogs(self._logs.logged_step, self._logs.updates)
        self.values = StepValues()
        out = orig(inputs)
        self._record_samples(out)
        if self._scored is not None:  # TRL's reward statistics' batch: every process's completions
            names = [column(n) for n in self.trainer.reward_func_names]
            self.step.log(**reward_scalars(self._scored[3], self.trainer.reward_weights, names))
        self.step.log(**rollout.step_metrics(self.trainer, out))
        return out

    def _rollout_index(self) -> int:
        """Generation batches so far, from TRL's optimizer step so a resumed run continues its numbering."""
        t = self.trainer
        per_generation = t.args.steps_per_generation * t.num_iterations  # micro-batches per generation
        done = t.state.global_step * t.args.gradient_accumulation_steps // per_generation
        return max(done, self.next_step)

    def _calculate_rewards(self, orig, inputs, prompts, completions, completion_ids_list, *a, **k):
        rewards_per_func = orig(inputs, prompts, completions, completion_ids_list, *a, **k)  # [B_all, F]
        self._scored = (prompts, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _record_samples(self, out: dict) -> None:
        t = self.trainer
        n = out["completion_ids"].size(0)
        first = t.accelerator.process_index * n  # TRL's process_slice: ranks hold consecutive rows
        sid = torch.arange(first, first + n, device=out["completion_ids"].device)  # [B]
        out[SAMPLE_KEY] = sid
        if self._scored is None:
            return
        prompts, completions, ids_list, per_func = self._scored
        local = per_func[first : first + n].float()  # [B, F]
        reward = (local * t.reward_weights.to(local.device)).nansum(1)  # [B] TRL's weighted sum
        reward[torch.isnan(local).all(1)] = float("nan")  # unscorable rows
        extra = {f"reward_{column(name)}": local[:, i].tolist() for i, name in enumerate(t.reward_func_names)}
        extra.update(rollout.sample_columns(out, slice(None)))
        adv = out["advantages"]
        self.step.samples(
            sample_ids=sid.tolist(),
            group_ids=(sid // t.num_generations).tolist(),
            prompts=[_text(p) for p in prompts],
            completions=[_text(c) for c in completions],
            rewards=reward.tolist(),
            advantages=adv.tolist() if adv.dim() == 1 else None,
            lengths=[len(ids) for ids in ids_list],
            **extra,
        )

    # -- the loss: capture inputs, then the log-probs TRL builds it from -----------------------------
    def _compute_loss(self, orig, model, inputs, *a, **k):
        if self.step is None or not torch.is_grad_enabled() or not self.trainer.model.training:
            return orig(model, inputs, *a, **k)
        self._inputs, self._pending, self._masks = inputs, None, {}
        try:
            with self._activations_kept():
                loss = orig(model, inputs, *a, **k)
        finally:
            self._inputs = None
        if self._pending is None:  # a loss built elsewhere: recording nothing would pass for a run
            self._refuse_untracked()
        self._track(inputs, self._pending)  # TRL's masks are known now; backward comes after compute_loss
        self._pending = None
        return loss

    def _activations_kept(self):
        """attach(bucket_activations=True) on a bucket step: the forward without gradient checkpointing
        (TRL's own context, as around its generation), so the bucket passes recompute no layer."""
        model = self.trainer.model
        if not (
            self.bucket_activations
            and self.step.bucket_passes.scheduled
            and getattr(model, "is_gradient_checkpointing", False)
        ):
            return contextlib.nullcontext()
        from trl.models.utils import disable_gradient_checkpointing

        return disable_gradient_checkpointing(model, self.trainer.args.gradient_checkpointing_kwargs)

    def _keep(self, name: str, mask):
        if self._pending is not None:
            self._masks[name] = mask.detach()
        return mask

    def _per_token_logps(self, orig, model, input_ids, attention_mask, logits_to_keep, *a, **k):
        active = self._inputs is not None and torch.is_grad_enabled()
        self._fused.start(active)
        try:
            out = orig(model, input_ids, attention_mask, logits_to_keep, *a, **k)
        finally:
            captured = self._fused.stop(logits_to_keep)
        if active:
            logps, entropies = out[0], out[1]
            if not torch.is_tensor(logps):  # a patched trainer computes its log-probs elsewhere (Unsloth)
                self._refuse_untracked()
            ids, mask = self._inputs["completion_ids"], self._inputs["completion_mask"]
            stats = fused_token_stats(logps, entropies, captured, ids, mask)
            # attribution steps score the same micro-batch again with substituted parameters
            again = lambda: orig(model, input_ids, attention_mask, logits_to_keep, *a, **k)[0]  # noqa: E731
            hidden = captured.head_input
            self._pending = ScoredPass(logprobs=logps, stats=stats, hidden=hidden, recompute=again)
            self._inputs = None  # one tracked pass per compute_loss call
        return out

    def _refuse_untracked(self) -> None:
        """Stop training where the loss's per-token log-probs never reached the hooks: the open step is
        dropped (never written without its tokens) and the run stays unfinished."""
        if self.step is not None:
            self.recorder.discard_step()
            self.step = None
        raise RuntimeError(nothing_tracked(self.trainer))

    def _track(self, inp, scored: ScoredPass) -> None:
        logps = scored.logprobs  # [B, T]
        mask = inp["completion_mask"]  # [B, T]
        loss_mask = rollout.loss_mask(inp)  # [B, T]
        old = inp.get("old_per_token_logps")
        old = logps.detach() if old is None else old  # TRL's own stand-in when the batch is on-policy
        adv = inp["advantages"]  # [B] or [B, T]
        sid = inp.get(SAMPLE_KEY)
        weights = token_weights(self.rule, logps, old, adv, loss_mask)
        clipped = clipped_tokens(self.clip, logps, old, adv, loss_mask)
        self.step.track(
            logps,
            token_ids=inp["completion_ids"],
            mask=mask,
            loss_mask=loss_mask,
            old_logprobs=old,
            ref_logprobs=inp.get("ref_per_token_logps"),
            rollout_logprobs=inp.get("sampling_per_token_logps"),
            is_weights=rollout.is_weights(inp, logps),
            mask_codes=rollout.mask_codes(self.trainer, inp, self._masks, logps),
            advantages=adv,
            weights=weights,
            scale_grad=weights,
            sample_ids=sid,
            group_ids=None if sid is None else sid // self.trainer.num_generations,
            stats=scored.stats,
            hidden=scored.hidden,
            clipped=clipped,
            update_id=self.update_id,
            recompute=scored.recompute,
        )
        self._accumulating = True
        kl, share = micro_batch_values(
            self.trainer, self.clip, logps, inp, loss_mask=loss_mask, clipped=clipped
        )
        self.step.log(**self.values.micro_batch(kl, share))

    # -- backward, gradient norms, optimizer updates -------------------------------------------------
    def _backward(self, orig, loss, **kwargs):
        st = self.step
        scale = loss_scale(self.trainer.accelerator)
        if st is not None and scale is not None:  # fp16: accelerate backpropagates scaler.scale(loss)
            st.host.set_loss_scale(scale)  # coef is read unscaled
        if st is None or not st.bucket_passes.keeps_graph:
            return orig(loss, **kwargs)
        kwargs.setdefault("retain_graph", True)  # the bucket and what-if passes run on the same graph
        plain = deepspeed_setup(self.trainer) is None  # DeepSpeed partitions .grad: no bucket is derived
        if plain:
            st.bucket_passes.before_backward()
        orig(loss, **kwargs)
        st.bucket_passes.analyze(loss if plain else None)

    def _training_step(self, orig, *a, **k):
        """The value the Trainer adds to the loss it logs, summed over the update's micro-batches."""
        loss = orig(*a, **k)
        if torch.is_tensor(loss):
            part = loss.detach().float().sum()
            self._update_loss = part if self._update_loss is None else self._update_loss + part
        return loss

    def _on_optimizer_step(self) -> None:
        self._lr = self.trainer._get_learning_rate()  # the update's lr: the scheduler has not stepped yet

    def _on_step_end(self, state) -> None:
        if self.step is not None:
            loss = math.nan if self._update_loss is None else float(self._update_loss)
            counters = dict(trl_global_step=state.global_step, trl_epoch=state.epoch)
            self.step.log(**self.values.update(loss, self._lr), **counters)
            self._logs.updates.ended(state.global_step, self.step.step)
        self._update_loss, self._lr = None, None
        self.update_id += 1
        self._norms_done = self._accumulating = False

    def _on_log(self, state, logs: dict) -> None:
        if self.step is None or any(k.startswith(SUMMARY_KEYS) for k in logs):
            return
        self.step.log(**self._logs.add(state.global_step, logs))


class _Callback(TrainerCallback):
    """Trainer events the recording needs: optimizer updates and TRL's logged metrics."""

    def __init__(self, recording: TRLRecording):
        self.recording = recording

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.recording.norms.before_optimizer_step()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.recording._on_optimizer_step()

    def on_step_end(self, args, state, control, **kwargs):
        self.recording._on_step_end(state)
        rec = self.recording.recorder
        if rec is not None and rec.halt_finding is not None:  # Doctor(halt=True): TRL's own clean stop
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.recording._on_log(state, logs or {})


def announce(recorder: Recorder, what: str) -> None:
    """One line on stderr (rank 0) where the run is written and how to look at it."""
    if recorder.rank == 0:
        run = recorder.run_dir
        print(
            f"tokengrad: {what}; recording to {run} (dashboard: tokengrad dashboard {run.parent}; "
            f"findings: tokengrad doctor {run})",
            file=sys.stderr,
            flush=True,
        )


def nothing_tracked(trainer) -> str:
    """Why a training loss could not be recorded: its log-probs never reached the hooked method."""
    return (
        f"tokengrad: {type(trainer).__name__}.compute_loss built the training loss without per-token "
        f"log-probs from _get_per_token_logps_and_entropies, so there is nothing to record coef from; "
        f"stopping rather than writing steps without tokens. attach() records an unmodified trl.GRPOTrainer"
    )


def _text(x) -> str:
    """A prompt or completion as text: plain strings as they are, chat messages as 'role: content' lines."""
    if isinstance(x, str):
        return x
    if isinstance(x, list):
        return "\n".join(
            f"{m.get('role', '')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in x
        )
    return str(x)
