"""Record verl actor updates and train with tokengrad's weighting rules inside verl (extra `verl`).

A verl user installs the extra and sets one config entry:

    actor_rollout_ref.actor.policy_loss.loss_mode=tokengrad            # verl's PPO loss, recorded
    actor_rollout_ref.actor.policy_loss.loss_mode=tokengrad_tr_grpo    # TR-GRPO weighting, recorded

verl imports the `verl.plugins` entry point group in every process (verl/__init__.py); tokengrad's entry
(tokengrad.integrations.verl.plugin) registers these names with `register_policy_loss` in
verl/trainer/ppo/core_algos.py. verl's loss entry, `ppo_loss` in verl/workers/utils/losses.py, calls the
registered function with the padded `log_prob` [B, T] the actor's gradient flows through; tokengrad tracks
that tensor, so an autograd hook reads the exact coef = dL/dlog pi_t of verl's actor loss (policy term
under every `loss_agg_mode`, and the KL loss, which is built on the same log_prob), and delegates the
loss itself to verl's `compute_policy_loss_vanilla` (nothing of verl's loss is re-implemented). A
weighting rule acts as a per-token scale of dL/dlog pi_t in backward, as in the TRL integration.

Each process writes its own rank's files into one run directory: $TOKENGRAD_RUN_DIR (on storage shared by
all nodes; default ./tokengrad_runs/verl). One tokengrad step is one optimizer update of the actor
(a `train_batch` of verl's engine: one PPO mini-batch), closed by torch's global optimizer-step hook.
docs/verl.md lists what is recorded (tokens, the settings verl exposes: settings.py) and what this seam
cannot see (rewards, the gradient norm, block norms).
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import os
import threading
import warnings

import torch

from tokengrad.integrations import host
from tokengrad.integrations.verl import rollout
from tokengrad.integrations.verl import settings as verl_settings
from tokengrad.integrations.verl.options import VerlOptions
from tokengrad.objective.weighting import TokenBatch
from tokengrad.record import RunInfo
from tokengrad.record.recorder import Recorder

TESTED_VERL = ("0.9", "0.10")  # [lowest, first untested) minor versions; keep in step with the `verl` extra
LOSS_PREFIX = "tokengrad"
# what verl's loss entry has and the policy loss does not receive, set by the entry for the call: the
# micro-batch's fields (rollout.ENTRY_KEYS: response ids, the engine's log-probs, rejection and probe masks),
# the run's settings and temperature (settings.py) and the token entropies [B, T] (None when not computed)
_ENTRY: contextvars.ContextVar = contextvars.ContextVar("tokengrad_verl_entry", default=None)


def loss_name(rule: str | None) -> str:
    """The verl `loss_mode` of a tokengrad rule (None: verl's PPO loss, recorded)."""
    return LOSS_PREFIX if rule is None else f"{LOSS_PREFIX}_{rule}"


def check_verl_version(version: str) -> bool:
    from packaging.version import Version

    lo, hi = (Version(v).release[:2] for v in TESTED_VERL)
    return lo <= Version(version).release[:2] < hi


def register_losses() -> list[str]:
    """Register every tokengrad loss with verl's policy-loss registry; returns the names registered."""
    import verl
    from verl.trainer.ppo import core_algos

    from tokengrad.objective.gradient_scale import supported_weightings

    if not check_verl_version(verl.__version__):
        raise RuntimeError(
            f"tokengrad's verl integration is tested with verl>={TESTED_VERL[0]},<{TESTED_VERL[1]} but verl "
            f"{verl.__version__} is installed; its policy-loss signature may differ. Install tokengrad[verl]."
        )
    _wrap_loss_entry()
    rollout.wrap_rollout_correction()
    names = []
    for rule in [None, *supported_weightings()]:
        name = loss_name(rule)
        if name not in core_algos.POLICY_LOSS_REGISTRY:
            core_algos.register_policy_loss(name)(make_policy_loss(rule))
        names.append(name)
    return names


def _wrap_loss_entry() -> None:
    """verl's actor loss entry, `verl.workers.utils.losses.ppo_loss`, wrapped so a tokengrad policy loss can
    read the micro-batch's response ids (it receives only log-probs). The plugin runs at `import verl`,
    before `verl.workers.engine_workers` binds `ppo_loss`; other loss modes pass straight through."""
    from verl.workers.utils import losses

    entry = losses.ppo_loss
    if getattr(entry, "_tokengrad", False):
        return

    @functools.wraps(entry)
    def ppo_loss(config, model_output, data, *args, **kwargs):
        mode = str(config.policy_loss.get("loss_mode", "vanilla"))
        if not mode.startswith(LOSS_PREFIX) or "responses" not in data.keys():
            return entry(config, model_output, data, *args, **kwargs)
        token = _ENTRY.set(_entry(config, model_output, data))
        try:
            return entry(config, model_output, data, *args, **kwargs)
        finally:
            _ENTRY.reset(token)

    ppo_loss._tokengrad = True
    losses.ppo_loss = ppo_loss


def _entry(config, model_output, data) -> dict:
    """What the policy loss of this micro-batch may read from verl's loss entry (see _ENTRY)."""
    entropy = model_output.get("entropy", None) if hasattr(model_output, "get") else None
    if entropy is not None:
        from verl.workers.utils.padding import no_padding_2_padding

        entropy = no_padding_2_padding(entropy, data).detach()  # [B, T], as ppo_loss slices it
    return {
        "tensors": {k: data[k] for k in rollout.ENTRY_KEYS if k in data.keys()},
        "settings": verl_settings.run_config(config, data),
        "temperature": verl_settings.temperature(data),
        "entropy": entropy,
    }


def make_policy_loss(rule: str | None):
    """A verl PolicyLossFn: verl's vanilla PPO loss on the tracked (and, with a rule, rescaled) log_prob."""
    from tokengrad.objective.gradient_scale import resolve_weighting

    resolved = resolve_weighting(rule, None)

    def policy_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

        weights = _weights(resolved, log_prob, old_log_prob, advantages, response_mask)  # [B, T] or None
        if torch.is_grad_enabled() and log_prob.requires_grad:
            recording(rule).track(
                log_prob,
                old_log_prob=old_log_prob,
                advantages=advantages,
                response_mask=response_mask,
                weights=weights,
                is_weights=rollout_is_weights,
                clipped=verl_settings.clipped(log_prob, old_log_prob, advantages, config),
            )
        pg_loss, metrics = compute_policy_loss_vanilla(
            old_log_prob,
            log_prob,
            advantages,
            response_mask,
            loss_agg_mode=loss_agg_mode,
            config=config,
            rollout_is_weights=rollout_is_weights,
        )
        if weights is not None:
            metrics["tokengrad/weight_mean"] = float(weights[response_mask.bool()].mean())
        return pg_loss, metrics

    policy_loss.__doc__ = f"verl's vanilla PPO loss, recorded by tokengrad; weighting: {rule or 'none'}"
    return policy_loss


def _weights(resolved, log_prob, old, adv, mask) -> torch.Tensor | None:
    if resolved is None:
        return None
    rule, params = resolved
    tw = rule(
        TokenBatch(
            logprobs=log_prob.detach(), old_logprobs=old.detach(), advantages=adv.detach(), mask=mask.float()
        ),
        **params,
    )
    if tw.loss_weight is None and tw.advantage_weight is None:
        return None
    return tw.effective().to(log_prob.device, log_prob.dtype)  # [B, T]


class VerlRecording:
    """The recorder of one verl process; a step spans the loss passes until the next optimizer update."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        rule: str | None,
        budget: int | None = None,
        *,
        settings: dict | None = None,
        temperature: float | None = None,
    ):
        """`settings`: what verl's config exposes (settings.run_config), into meta.json's `config`;
        `temperature`: the sampler's, into meta.json's `temperature`."""
        import verl

        from tokengrad.objective.gradient_scale import weighting_meta

        meta = weighting_meta(rule, None)
        config = {"integration": "verl", "verl_version": verl.__version__, "loss_mode": loss_name(rule)}
        self.recorder = Recorder(
            run_dir,
            config={**(settings or {}), **config},
            info=RunInfo(weighting=meta, temperature=temperature),
            budget=budget,
        ).open()
        self.rule = rule
        self.step = None
        self.next_step = 0
        self._rows = 0
        self._parts: list[host.MicroBatch] = []  # the step's rollout tensors, for its metrics
        self._entropy = [0.0, 0]  # the step's summed loss-token entropy and its token count
        self._lock = threading.Lock()
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hook = register_optimizer_step_post_hook(self._on_update)

    def track(
        self,
        log_prob,
        *,
        old_log_prob,
        advantages,
        response_mask,
        weights=None,
        is_weights=None,
        clipped=None,
    ) -> None:
        """Track one micro-batch's log_prob [B, T] (with graph) and what verl's policy loss received;
        `clipped` [B, T]: the tokens verl's clip cuts (settings.clipped)."""
        with self._lock:
            if self.step is None:
                self.step = self.recorder.begin_step(self.next_step)
                self._rows, self._parts, self._entropy = 0, [], [0.0, 0]
            n, t = log_prob.shape
            found = _ENTRY.get() or {}
            entry = {k: host.padded(v, t) for k, v in found.get("tensors", {}).items()}
            self._add_entropy(found.get("entropy"), response_mask)
            ids = entry.get("responses")
            if ids is None or tuple(ids.shape) != (n, t):
                raise RuntimeError(
                    f"tokengrad's verl loss needs the response ids of its micro-batch [{n}, {t}] from verl's "
                    f"loss entry (verl.workers.utils.losses.ppo_loss, wrapped when verl loads the plugin); "
                    f"got {None if ids is None else tuple(ids.shape)}. Call it through that entry."
                )
            dev = log_prob.device
            part = rollout.micro_batch(
                {k: v.to(dev) for k, v in entry.items()}, old_log_prob, response_mask, is_weights
            )
            self._parts.append(part)
            first = self.recorder.rank * host.SAMPLE_STRIDE + self._rows
            self._rows += n
            sid = torch.arange(first, first + n, device=dev)  # [B]
            self.step.track(
                log_prob,
                token_ids=ids.to(dev),
                mask=part.mask,
                loss_mask=response_mask,
                old_logprobs=part.old,
                rollout_logprobs=part.rollout,
                is_weights=part.is_weights,
                mask_codes=part.codes,
                advantages=advantages,
                weights=weights,
                scale_grad=weights,
                sample_ids=sid,
                clipped=None if clipped is None else clipped.to(dev),
            )

    def _add_entropy(self, entropy, response_mask) -> None:
        if entropy is None or tuple(entropy.shape) != tuple(response_mask.shape):
            return
        mask = response_mask.bool()  # [B, T]
        self._entropy[0] += float(entropy.float()[mask].sum())
        self._entropy[1] += int(mask.sum())

    def _end_step(self) -> None:
        total, n = self._entropy
        self.step.log(**host.step_metrics(self._parts), **({"entropy_mean": total / n} if n else {}))
        self.recorder.end_step()
        self.step, self._parts = None, []

    def _on_update(self, optimizer, args, kwargs) -> None:
        with self._lock:
            if self.step is not None:
                self._end_step()
                self.next_step += 1

    def close(self) -> None:
        """End the open step and close the recorder (finished steps are already on disk)."""
        with self._lock:
            self._hook.remove()
            if self.step is not None:
                self._end_step()
            self.recorder.close()


_RECORDING: VerlRecording | None = None


def recording(rule: str | None = None) -> VerlRecording:
    """This process's recording, opened by the first tokengrad loss call into $TOKENGRAD_RUN_DIR."""
    global _RECORDING
    if _RECORDING is None:
        opts = VerlOptions.from_env()
        entry = _ENTRY.get() or {}
        _RECORDING = VerlRecording(
            opts.run_dir,
            rule,
            opts.token_budget,
            settings=entry.get("settings"),
            temperature=entry.get("temperature"),
        )
        if opts.mismatch_probe_every is not None:
            from tokengrad.integrations.verl import probe

            if probe.INSTALL_ERROR is not None:
                warnings.warn(
                    f"tokengrad: mismatch_probe_every={opts.mismatch_probe_every} is set but the probe is "
                    f"{probe.INSTALL_ERROR}; in bypass mode the gap stays unrecorded",
                    RuntimeWarning,
                    stacklevel=3,
                )
        atexit.register(close_recording)
    elif _RECORDING.rule != rule:
        raise ValueError(
            f"this process records loss_mode {loss_name(_RECORDING.rule)!r}; one process runs one tokengrad "
            f"loss, got {loss_name(rule)!r} as well"
        )
    return _RECORDING


def close_recording() -> None:
    """Close this process's recording (also run at exit); the next tokengrad loss call opens a new one."""
    global _RECORDING
    rec, _RECORDING = _RECORDING, None
    if rec is not None:
        rec.close()
