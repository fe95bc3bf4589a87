"""The mismatch probe for verl's bypass mode: one no-grad forward of the trainer's model on the rollout batch,
every N-th actor update, so the gap log pi_old - log mu is known where verl never computes pi_old.

In bypass mode (algorithm.rollout_correction.bypass_mode=True, and the fully-async trainer, which forces
it) verl copies rollout_log_probs into old_log_probs and skips the old-log-prob forward, so every mismatch
metric is absent (verl PR #7196, which restored them with an extra forward, was closed). With
$TOKENGRAD_MISMATCH_PROBE_EVERY=N (VerlOptions.mismatch_probe_every) the plugin wraps verl's
`TrainingWorker.train_mini_batch` (verl/workers/engine_workers.py: one rollout batch of this data-parallel
rank, before it is split into PPO mini-batches): on every N-th call whose loss mode is a tokengrad loss and
whose batch is in bypass (old_log_probs equal to rollout_log_probs), it first runs the worker's own
`infer_batch` (the engine forward verl's `compute_log_prob` uses, in eval mode, under no_grad) on a shallow
copy of the batch and stores the log-probs [B, R] as a batch field (rollout.PROBE_KEY). The field travels
with verl's mini-batch iterator to every micro-batch of the loss entry, where the recording takes it as
log pi_old. The probe runs before any of the batch's updates, so it is pi_old exactly as verl's decoupled
mode would have computed it; its cost is one forward pass of the batch per N updates.
"""

from __future__ import annotations

import functools

import torch

from tokengrad.integrations.host import same
from tokengrad.integrations.verl.losses import LOSS_PREFIX
from tokengrad.integrations.verl.options import VerlOptions
from tokengrad.integrations.verl.rollout import PROBE_KEY, ROLLOUT_KEY

_UPDATES: dict[int, int] = {}  # id(worker) -> tokengrad bypass updates seen in this process


def _loss_mode(worker) -> str:
    config = getattr(getattr(worker, "loss_fn", None), "keywords", {}).get("config")
    return "" if config is None else str(config.policy_loss.get("loss_mode", "vanilla"))


def _values(x: torch.Tensor) -> torch.Tensor:
    return x.values() if x.is_nested else x


def in_bypass(data) -> bool:
    """verl's bypass mode: old_log_probs is a copy of rollout_log_probs (on every response token)."""
    keys = data.keys()
    if ROLLOUT_KEY not in keys or "old_log_probs" not in keys:
        return False
    old, roll = data["old_log_probs"], data[ROLLOUT_KEY]
    if old.is_nested or roll.is_nested:
        return old.is_nested and roll.is_nested and same(_values(old), _values(roll))
    mask = data["response_mask"].bool()  # [B, R]
    return bool(mask.any()) and same(old[mask], roll[mask])


def due(worker, data, every: int | None) -> bool:
    """This call of train_mini_batch is a probe: a tokengrad loss, bypass, and the N-th such update."""
    if every is None or not _loss_mode(worker).startswith(LOSS_PREFIX) or not in_bypass(data):
        return False
    seen = _UPDATES.get(id(worker), 0)
    _UPDATES[id(worker)] = seen + 1
    return seen % every == 0


def probe_log_probs(worker, data) -> torch.Tensor | None:
    """[B, R] log pi of the response tokens under the worker's model now, from its own no-grad forward;
    None on ranks the engine returns no output to (tensor/pipeline-parallel non-source ranks)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    td = data.copy()  # infer_batch writes its own micro-batch defaults into its input: keep data clean
    tu.assign_non_tensor(td, compute_loss=False, calculate_entropy=False)
    out = worker.infer_batch(td)
    if out is None:
        return None
    return no_padding_2_padding(tu.get(out, "log_probs"), data).float().detach()


def wrap_train_mini_batch(cls=None) -> None:
    """Wrap `cls.train_mini_batch` (default verl's TrainingWorker) with the probe, a no-op unless the probe
    is due. The wrapper keeps verl's dispatch attributes (functools.wraps copies them), so worker groups
    bind it as before; calls that do not carry a TensorDict (a TransferQueue handle) pass straight through."""
    from tensordict import TensorDict

    global INSTALL_ERROR
    if cls is None:
        from verl.workers import engine_workers

        cls = engine_workers.TrainingWorker
    orig = cls.train_mini_batch
    if getattr(orig, "_tokengrad", False):
        return

    @functools.wraps(orig)
    def train_mini_batch(self, *args, **kwargs):
        data = kwargs.get("data", args[0] if args else None)
        if isinstance(data, TensorDict) and due(self, data, VerlOptions.from_env().mismatch_probe_every):
            probed = probe_log_probs(self, data)
            if probed is not None:
                data[PROBE_KEY] = probed
        return orig(self, *args, **kwargs)

    train_mini_batch._tokengrad = True
    cls.train_mini_batch = train_mini_batch
    INSTALL_ERROR = None


def install() -> str | None:
    """Wrap verl's TrainingWorker (the plugin calls this when the probe is asked for); returns why it could
    not (verl's engine workers failed to import), else None."""
    global INSTALL_ERROR
    try:
        wrap_train_mini_batch()
    except ImportError as e:
        INSTALL_ERROR = f"verl.workers.engine_workers does not import here ({e})"
    return INSTALL_ERROR


INSTALL_ERROR: str | None = "not installed (set $TOKENGRAD_MISMATCH_PROBE_EVERY before `import verl`)"
