"""The recorder of one OpenRLHF policy-actor process: one tokengrad step per optimizer update of the actor.

OpenRLHF's `ActorPPOTrainer.training_step` (openrlhf/trainer/ray/ppo_actor.py) runs one micro-batch: the
actor's forward, `actor_loss_fn` (a `PolicyLoss`, openrlhf/models/loss.py), DeepSpeed's backward and
`strategy.optimizer_step`, which steps the optimizer only at the end of a gradient-accumulation window.
Each loss call is one pass of the open step; torch's global optimizer-step hook marks the update, and the
step is ended when that training step returns, with OpenRLHF's own `actor_grad_norm` (DeepSpeed's
pre-clip global norm) as `ds_grad_norm`. The rollout side (the engine's log-probs, the IS weights the loss
applied, the masks) and the step's gap metrics are shared with the verl plugin (tokengrad.integrations.host).
"""

from __future__ import annotations

import atexit
import math
import os
import threading

import torch

from tokengrad.integrations import host
from tokengrad.integrations.openrlhf.options import OpenRLHFOptions
from tokengrad.record import RunInfo
from tokengrad.record.recorder import Recorder

# PolicyLoss's settings (its constructor arguments, as attributes) kept in meta.json
LOSS_SETTINGS = (
    "policy_loss_type",
    "token_level_loss",
    "clip_eps_low",
    "clip_eps_high",
    "dual_clip",
    "is_correction_level",
    "is_correction_mode",
    "is_correction_gating",
    "is_correction_threshold",
)


def openrlhf_version() -> str | None:
    """The installed OpenRLHF's version (its package sets no __version__), None where not installed."""
    from importlib import metadata

    try:
        return metadata.version("openrlhf")
    except metadata.PackageNotFoundError:
        return None


def loss_settings(loss_fn) -> dict:
    """The PolicyLoss settings of meta.json (tuples as lists, so the config reads back equal)."""
    out = {k: getattr(loss_fn, k, None) for k in LOSS_SETTINGS}
    if out["is_correction_threshold"] is not None:
        out["is_correction_threshold"] = [float(x) for x in out["is_correction_threshold"]]
    return out


class OpenRLHFRecording:
    """This process's Recorder; a step spans the loss calls until the training step that updated."""

    def __init__(self, run_dir: str | os.PathLike, loss_fn, *, temperature=None, budget: int | None = None):
        config = {
            "integration": "openrlhf",
            "openrlhf_version": openrlhf_version(),
            "policy_loss": loss_settings(loss_fn),
        }
        info = RunInfo(temperature=temperature)
        self.recorder = Recorder(run_dir, config=config, info=info, budget=budget).open()
        self.step = None
        self.next_step = 0
        self._rows = 0
        self._parts: list[host.MicroBatch] = []  # the step's rollout tensors, for its metrics
        self._updated = False  # an optimizer update happened during the open step
        self._lock = threading.Lock()
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hook = register_optimizer_step_post_hook(self._on_update)

    def track(self, log_probs, *, old_log_probs, advantages, action_mask, rollout_log_probs, is_weights, ids):
        """One loss call. All [B, A] (A: the action span): the log-probs the loss is built from (with
        graph), π_old, advantages, the action mask, the engine's log-probs or None, the IS weights the
        loss applied or None, and the action tokens' ids."""
        with self._lock:
            if self.step is None:
                self.step = self.recorder.begin_step(self.next_step)
                self._rows, self._parts = 0, []
            dev = log_probs.device
            engine = None if rollout_log_probs is None else rollout_log_probs.detach()
            part = host.micro_batch(old_log_probs, action_mask, is_weights, rollout=engine)
            self._parts.append(part)
            n = log_probs.shape[0]
            first = self.recorder.rank * host.SAMPLE_STRIDE + self._rows
            self._rows += n
            self.step.track(
                log_probs,
                token_ids=ids.to(dev),
                mask=part.mask,
                loss_mask=action_mask,
                old_logprobs=part.old,
                rollout_logprobs=part.rollout,
                is_weights=part.is_weights,
                mask_codes=part.codes,
                advantages=advantages,
                sample_ids=torch.arange(first, first + n, device=dev),  # [B]
            )

    def _on_update(self, optimizer, args, kwargs) -> None:
        with self._lock:
            self._updated = self.step is not None

    def after_training_step(self, status) -> None:
        """End the step if this training step updated the actor (its optimizer step ran)."""
        with self._lock:
            if not self._updated:
                return
            norm = ((status or {}).get("metrics") or {}).get("actor_grad_norm")
            if norm is not None and math.isfinite(float(norm)):
                self.step.log(ds_grad_norm=float(norm))
            self._end_step()
            self.next_step += 1

    def _end_step(self) -> None:
        self.step.log(**host.step_metrics(self._parts))
        self.recorder.end_step()
        self.step, self._parts, self._updated = None, [], False

    def close(self) -> None:
        """End the open step and close the recorder (finished steps are already on disk)."""
        with self._lock:
            self._hook.remove()
            if self.step is not None:
                self._end_step()
            self.recorder.close()


_RECORDING: OpenRLHFRecording | None = None


def recording(loss_fn, temperature=None) -> OpenRLHFRecording:
    """This process's recording, opened by the first recorded loss call into $TOKENGRAD_RUN_DIR."""
    global _RECORDING
    if _RECORDING is None:
        opts = OpenRLHFOptions.from_env()
        _RECORDING = OpenRLHFRecording(
            opts.run_dir, loss_fn, temperature=temperature, budget=opts.token_budget
        )
        atexit.register(close_recording)
    return _RECORDING


def current() -> OpenRLHFRecording | None:
    return _RECORDING


def close_recording() -> None:
    """Close this process's recording (also run at exit); the next recorded loss call opens a new one."""
    global _RECORDING
    rec, _RECORDING = _RECORDING, None
    if rec is not None:
        rec.close()
