"""Record an unmodified TRL `GRPOTrainer` run into the tokengrad run format.

    from trl import GRPOConfig, GRPOTrainer
    from tokengrad.integrations.trl import attach

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(..., logging_steps=1), ...)
    attach(trainer, "runs/trl_demo")                    # or attach(trainer, "runs/x", weighting="tr_grpo")
    trainer.train()

Nothing of TRL's loss is re-implemented (copies drift: TRL PR #6856). Per token, logprob is the tensor
`_get_per_token_logps_and_entropies` returns inside `compute_loss`, and coef = dL/dlog pi is read by an
autograd hook on it, exact for every `loss_type`, clip, KL, mask and aggregation; entropy and sum_j p_j^2
come from TRL's fused LM head (temperature-scaled, like the log-probs); old/ref log-probs, advantages and
masks from the inputs of `compute_loss`. Grad norms are read when the trainer calls
`accelerator.clip_grad_norm_` (before clipping); rewards and completions where TRL scores them; TRL's
logged metrics go to the steps table. One tokengrad step is one TRL generation batch, holding
`steps_per_generation * num_iterations / gradient_accumulation_steps` optimizer updates (`update_id`).

A weighting rule acts as a scale of dL/dlog pi_t in backward: the update becomes sum_t w_t c_t grad log pi_t,
the gradient of TRL's loss with each token's term (policy term, plus beta * KL when beta > 0) multiplied
by the detached w_t before TRL's aggregation (exact for importance_sampling_level="token"; the entropy
bonus is not scaled). Rules that need a weight inside the clip, an added penalty or extra update phases are
refused. docs/api.md has the details.
"""

from __future__ import annotations

import re
import warnings

import torch
from transformers import TrainerCallback

from tokengrad.integrations.trl_deepspeed import DeepSpeedNorms, check_deepspeed, deepspeed_setup
from tokengrad.integrations.trl_fused import FusedCapture, fused_token_stats
from tokengrad.record.recorder import Recorder
from tokengrad.record.stats import TokenStats
from tokengrad.train.weighting import (
    WEIGHTINGS,
    TokenBatch,
    get_weighting,
    rule_params,
    validate_params,
    weight_curve,
)

TESTED_TRL = ("1.16", "1.17")  # [lowest, first untested) minor versions; keep in step with the `trl` extra
SAMPLE_KEY = "tokengrad_sample_id"  # [B] global completion index, carried through TRL's shuffle and split
NOT_A_GRADIENT_SCALE = {"ratio_weight": "a weight inside min/clip", "kl_cov_coef": "an added penalty term",
                        "phases": "extra update phases"}
_HOOKED = ("compute_loss", "_get_per_token_logps_and_entropies", "_generate_and_score_completions",
           "_calculate_rewards")
# TRL metric -> run-format steps column; every other numeric metric becomes `trl_<name>`.
_STEP_COLUMNS = {"loss": "loss", "reward": "reward_mean", "reward_std": "reward_std", "kl": "kl",
                 "learning_rate": "lr", "clip_ratio/region_mean": "clip_frac"}
_SUMMARY_KEYS = ("train_", "eval_", "total_flos")  # end-of-training summaries and evaluations: not a step


def attach(trainer, run_dir, *, weighting: str | None = None, weighting_params: dict | None = None,
           run_name: str | None = None, bucket_every: int = 0, allow_untested_trl: bool = False,
           **recorder_kwargs) -> "TRLRecording":
    """Record `trainer` (a `trl.GRPOTrainer`, before `train()`) into `run_dir`; returns the recording.

    Args:
        weighting, weighting_params: a rule of `tokengrad.train.weighting` applied as a per-token gradient
            scale (see the module docs for what that equals); None records plain TRL.
        bucket_every: probability-bucket gradient analysis every N steps (0 = off; one extra backward per
            bucket on those steps).
        allow_untested_trl: try a TRL version outside `TESTED_TRL` instead of refusing it.
        recorder_kwargs: passed to `tokengrad.Recorder` (layers, on_error, compact_every, ...).
    """
    import trl

    check_trl_version(trl.__version__, allow_untested_trl)
    check_trainer(trainer)
    check_deepspeed(deepspeed_setup(trainer), bucket_every)  # docs/deepspeed.md
    rule = resolve_weighting(weighting, weighting_params)
    tokenizer = getattr(trainer, "_tokenizer", None) or trainer.processing_class
    model_cfg = getattr(trainer.model, "config", None)
    rec = Recorder(
        run_dir,
        model=trainer.model,
        tokenizer=tokenizer,
        config=_run_config(trainer, trl.__version__),
        run_name=run_name,
        model_name=getattr(model_cfg, "_name_or_path", None) or None,
        weighting=_weighting_meta(weighting, weighting_params),
        bucket_every=bucket_every,
        **recorder_kwargs,
    )
    return TRLRecording(trainer, rec, rule).install()


def check_trl_version(version: str, allow_untested: bool = False) -> None:
    """Refuse TRL releases outside TESTED_TRL: the hooks reach into GRPOTrainer's private methods."""
    from packaging.version import Version

    lo, hi = (Version(v).release[:2] for v in TESTED_TRL)
    if lo <= Version(version).release[:2] < hi or allow_untested:
        return
    raise RuntimeError(
        f"tokengrad's TRL integration is tested with trl>={TESTED_TRL[0]},<{TESTED_TRL[1]} "
        f"but trl {version} is "
        f"installed. It hooks GRPOTrainer internals ({', '.join(_HOOKED)}) whose signatures and data change "
        f"between releases, so another version may record wrong numbers. Install `tokengrad[trl]`, or pass "
        f"allow_untested_trl=True to try anyway."
    )


def check_trainer(trainer) -> None:
    """A clear error for trainers whose per-token log-probs cannot be hooked."""
    from trl import GRPOTrainer

    if not isinstance(trainer, GRPOTrainer):
        raise ValueError(f"attach() records a trl.GRPOTrainer, got {type(trainer).__name__}")
    missing = [name for name in _HOOKED if not callable(getattr(trainer, name, None))]
    if missing:
        raise RuntimeError(f"this GRPOTrainer has no {missing}; the TRL integration cannot attach to it")
    if getattr(trainer.args, "use_liger_kernel", False) and hasattr(trainer, "compute_liger_loss"):
        raise ValueError(
            "use_liger_kernel=True: this TRL computes the GRPO loss inside Liger's fused kernel "
            "(compute_liger_loss), which bypasses _compute_loss and never exposes per-token log-probs, so "
            "coef, entropy and the weighting hook have nothing to attach to. Set use_liger_kernel=False."
        )
    if getattr(trainer, "_tokengrad_recording", None) is not None:
        raise ValueError("a tokengrad recording is already attached to this trainer")


# ---- weighting ----------------------------------------------------------------------------------


def _probe_batch():
    lp = torch.tensor([[0.05, 0.3, 0.6, 0.95], [0.2, 0.5, 0.7, 0.9]]).log()  # [2, 4]
    return TokenBatch(lp, lp - 0.1, torch.tensor([1.0, -1.0]), torch.ones(2, 4))


def unsupported_fields(name: str, params: dict | None = None) -> list[str]:
    """Fields of the rule's TokenWeights that a gradient scale of dL/dlog pi cannot express."""
    weights = get_weighting(name)(_probe_batch(), **(params or {}))
    return [f for f in NOT_A_GRADIENT_SCALE if getattr(weights, f) is not None]


def supported_weightings() -> list[str]:
    """Registered rules that act inside TRL, with their default parameters."""
    return [n for n in sorted(WEIGHTINGS) if not unsupported_fields(n)]


def resolve_weighting(name: str | None, params: dict | None):
    """(rule, params) for a rule expressible as a gradient scale, else a ValueError listing those that are."""
    if name is None:
        return None
    rule, params = get_weighting(name), dict(params or {})
    validate_params(name, params)
    bad = unsupported_fields(name, params)
    if bad:
        why = ", ".join(f"{f} ({NOT_A_GRADIENT_SCALE[f]})" for f in bad)
        raise ValueError(
            f"weighting {name!r} with {params} uses {why}, which cannot act as a per-token scale of "
            f"dL/dlog pi on TRL's unmodified loss; rules that can: {supported_weightings()}"
        )
    return rule, params


def _weighting_meta(name: str | None, params: dict | None) -> dict | None:
    if name is None:
        return None
    full = {**rule_params(name), **(params or {})}
    return {"name": name, "params": full, "curve": weight_curve(name, params), "applied_as": "grad_scale"}


def _run_config(trainer, trl_version: str) -> dict:
    args = trainer.args.to_dict() if hasattr(trainer.args, "to_dict") else dict(vars(trainer.args))
    ds = deepspeed_setup(trainer)
    extra = {} if ds is None else {"deepspeed": {"zero_stage": ds.zero_stage, "config": ds.config}}
    return {"integration": "trl", "trl_version": trl_version, "trainer": type(trainer).__name__, "args": args,
            **extra}


# ---- the recording ------------------------------------------------------------------------------


class TRLRecording:
    """The hooks on one trainer and the recorder they feed; `detach()`, called when `train()` returns or
    raises, ends the open step, closes the recorder and restores the trainer."""

    def __init__(self, trainer, recorder: Recorder, rule=None):
        self.trainer, self.recorder, self.rule = trainer, recorder, rule
        self.step = None  # the open tokengrad step (StepRecorder) or None
        self.next_step = 0
        self.update_id = 0
        self._norms_done = False
        self._inputs = None  # compute_loss inputs while TRL computes the loss
        self._scored = None  # (prompts, completions, completion_ids, rewards_per_func) of the batch
        self._patched: list[tuple[object, str, object]] = []
        self._fused = FusedCapture(trainer)
        self._callback = None

    def install(self) -> "TRLRecording":
        t = self.trainer
        self._patch(t, "train", self._train)
        self._patch(t, "compute_loss", self._compute_loss)
        self._patch(t, "_get_per_token_logps_and_entropies", self._per_token_logps)
        self._patch(t, "_generate_and_score_completions", self._generate_and_score)
        self._patch(t, "_calculate_rewards", self._calculate_rewards)
        self._patch(t.accelerator, "clip_grad_norm_", self._clip_grad_norm)
        self._patch(t.accelerator, "backward", self._backward)
        if deepspeed_setup(t) is not None:  # norms through DeepSpeed's API: .grad is partitioned
            DeepSpeedNorms(self).install()
        self._fused.install()
        self._callback = _Callback(self)
        t.add_callback(self._callback)
        t._tokengrad_recording = self
        self.recorder.open()
        return self

    def detach(self) -> None:
        """End the open step, close the recorder (flushing its files) and restore the trainer."""
        if self.recorder is None:
            return
        try:
            if self.step is not None:
                self.recorder.end_step()
        finally:
            self.step = None
            self.recorder.close()
            for obj, name, old in reversed(self._patched):
                if old is None:
                    delattr(obj, name)
                else:
                    setattr(obj, name, old)
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
        try:
            return orig(*a, **k)
        finally:  # also when training fails: finished steps reach disk
            self.detach()

    # -- generation: one tokengrad step per generation batch ----------------------------------------
    def _generate_and_score(self, orig, inputs):
        if not self.trainer.model.training:  # evaluation batches are not recorded
            return orig(inputs)
        if self.step is not None:
            self.recorder.end_step()
        self.step = self.recorder.begin_step(self._rollout_index())
        self.next_step = self.step.step + 1
        self.update_id, self._norms_done, self._scored = 0, False, None
        out = orig(inputs)
        self._record_samples(out)
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
        extra = {
            f"reward_{_column(name)}": local[:, i].tolist() for i, name in enumerate(t.reward_func_names)
        }
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
        self._inputs = inputs
        try:
            return orig(model, inputs, *a, **k)
        finally:
            self._inputs = None

    def _per_token_logps(self, orig, model, input_ids, attention_mask, logits_to_keep, *a, **k):
        active = self._inputs is not None and torch.is_grad_enabled()
        self._fused.start(active)
        try:
            out = orig(model, input_ids, attention_mask, logits_to_keep, *a, **k)
        finally:
            sum_p2, hidden = self._fused.stop(logits_to_keep)
        if active:
            logps, entropies = out[0], out[1]
            self._track(logps, fused_token_stats(logps, entropies, sum_p2), hidden)
            self._inputs = None  # one tracked pass per compute_loss call
        return out

    def _track(self, logps: torch.Tensor, stats: TokenStats | None, hidden: torch.Tensor | None) -> None:
        inp = self._inputs
        mask = inp["completion_mask"]  # [B, T]
        loss_mask = mask * inp["tool_mask"] if "tool_mask" in inp else mask  # [B, T]
        old = inp.get("old_per_token_logps")
        old = logps.detach() if old is None else old  # TRL's own stand-in when the batch is on-policy
        adv = inp["advantages"]  # [B] or [B, T]
        sid = inp.get(SAMPLE_KEY)
        weights = self._weights(logps, old, adv, loss_mask)
        extra = {}
        if torch.is_tensor(inp.get("importance_sampling_ratio")):  # vLLM correction
            extra["trl_is_ratio"] = inp["importance_sampling_ratio"].expand_as(logps).float()
        self.step.track(
            logps,
            token_ids=inp["completion_ids"],
            mask=mask,
            loss_mask=loss_mask,
            old_logprobs=old,
            ref_logprobs=inp.get("ref_per_token_logps"),
            advantages=adv,
            weights=weights,
            scale_grad=weights,
            sample_ids=sid,
            group_ids=None if sid is None else sid // self.trainer.num_generations,
            stats=stats,
            hidden=hidden,
            update_id=self.update_id,
            extra=extra,
        )

    def _weights(self, logps, old, adv, loss_mask) -> torch.Tensor | None:
        if self.rule is None:
            return None
        rule, params = self.rule
        tw = rule(TokenBatch(logps.detach(), old.detach(), adv, loss_mask.float()), **params)
        bad = [f for f in NOT_A_GRADIENT_SCALE if getattr(tw, f) is not None]
        if bad:  # attach() probed the rule; a rule whose output depends on the batch can still get here
            raise ValueError(
                f"the weighting rule returned {bad} for this batch; only a per-token scale can act in TRL"
            )
        if all(w is None for w in (tw.loss_weight, tw.advantage_weight)):
            return None  # the rule left all tokens at 1
        return tw.effective().to(logps.device)  # [B, T]

    # -- backward, gradient norms, optimizer updates -------------------------------------------------
    def _backward(self, orig, loss, **kwargs):
        st = self.step
        if st is None or not st.is_bucket_step:
            return orig(loss, **kwargs)
        kwargs.setdefault("retain_graph", True)  # the bucket passes run on the same graph
        orig(loss, **kwargs)
        st.analyze_buckets()

    def _clip_grad_norm(self, orig, *a, **k):
        self._record_norms()  # before clipping changes .grad
        return orig(*a, **k)

    def _record_norms(self) -> None:
        if self.step is not None and not self._norms_done:
            self.step.record_grad_norms(self.update_id)
            self._norms_done = True

    def _on_pre_optimizer_step(self) -> None:
        if self.step is not None and not self._norms_done:
            warnings.warn(
                "tokengrad: the trainer clipped gradients without accelerator.clip_grad_norm_; "
                "gradient norms are read after clipping",
                RuntimeWarning,
                stacklevel=2,
            )
            self._record_norms()

    def _on_step_end(self) -> None:
        self.update_id += 1
        self._norms_done = False

    def _on_log(self, state, logs: dict) -> None:
        if self.step is None or any(k.startswith(_SUMMARY_KEYS) for k in logs):
            return
        scalars = {
            _STEP_COLUMNS.get(k, f"trl_{_column(k)}"): float(v)
            for k, v in logs.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self.step.log(trl_global_step=state.global_step, **scalars)


class _Callback(TrainerCallback):
    """Trainer events the recording needs: optimizer updates and TRL's logged metrics."""

    def __init__(self, recording: TRLRecording):
        self.recording = recording

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.recording._on_pre_optimizer_step()

    def on_step_end(self, args, state, control, **kwargs):
        self.recording._on_step_end()

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.recording._on_log(state, logs or {})


def _column(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", str(name)).strip("_")


def _text(x) -> str:
    """A prompt or completion as text: plain strings as they are, chat messages as 'role: content' lines."""
    if isinstance(x, str):
        return x
    if isinstance(x, list):
        return "\n".join(
            f"{m.get('role', '')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in x
        )
    return str(x)
