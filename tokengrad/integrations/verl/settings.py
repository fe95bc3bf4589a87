"""What verl tells its policy-loss seam about the run: the settings the plugin writes into meta.json's
`config` (read back by tokengrad.doctor.settings), the tokens its PPO clip cuts, and the step's entropy.

verl gives the loss entry, `ppo_loss(config, model_output, data)` (verl/workers/utils/losses.py):

- `config`: the actor's ActorConfig (verl/workers/config/actor.py): `rollout_n` (G, set from
  actor_rollout_ref.rollout.n), `loss_agg_mode`, `clip_ratio_low` / `clip_ratio_high` / `clip_ratio_c`,
  `ppo_epochs`, `use_kl_loss` and `kl_loss_coef`, `entropy_coeff`;
- `data`, the micro-batch: `temperature` (the legacy trainer, verl/trainer/ppo/ray_trainer.py
  `_update_actor`, puts actor_rollout_ref.rollout.temperature into the batch's meta_info) and
  `max_response_len`, which `left_right_2_no_padding` (verl/workers/utils/padding.py) sets to the width of
  the padded responses: the agent loop pads every response to rollout.response_length (=
  data.max_response_length), so it is the length limit. The v1 trainer hands over jagged responses and
  sets neither: there the length limit and temperature stay unknown and the doctor says truncation is not
  checked;
- `model_output["entropy"]`: the token entropies, when the actor computes them (`calculate_entropy`, or
  an entropy bonus).
"""

from __future__ import annotations

import torch

# ActorConfig fields recorded as they are (verl's names); use_kl_loss decides whether kl_loss_coef is beta
ACTOR_KEYS = (
    "loss_agg_mode",
    "rollout_n",
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "ppo_epochs",
    "use_kl_loss",
    "kl_loss_coef",
    "entropy_coeff",
)
LIMIT_KEY = "max_response_len"  # verl's name in the batch; recorded as `response_length`
TEMPERATURE_KEY = "temperature"


def _scalar(value):
    """A plain bool, int, float or str (what JSON holds), else None (a missing or per-sample value)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else None
    if hasattr(value, "data") and not isinstance(value, bool | int | float | str):  # tensordict NonTensorData
        value = value.data
    return value if isinstance(value, bool | int | float | str) else None


def _batch_value(data, key: str):
    try:
        return _scalar(data.get(key, None))
    except (AttributeError, KeyError, RuntimeError):
        return None


def run_config(config, data) -> dict:
    """The settings verl's actor config and micro-batch expose, under verl's names (response_length for
    the batch's max_response_len); a setting verl does not give is left out, never guessed."""
    out = {}
    for key in ACTOR_KEYS:
        value = _scalar(config.get(key, None)) if config is not None else None
        if value is not None:
            out[key] = value
    limit = _batch_value(data, LIMIT_KEY)
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        out["response_length"] = limit
    return out


def temperature(data) -> float | None:
    """The sampling temperature verl's trainer put into the batch (one number for the batch), else None."""
    value = _batch_value(data, TEMPERATURE_KEY)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@torch.no_grad()
def clipped(log_prob, old_log_prob, advantages, config) -> torch.Tensor | None:
    """[B, T] bool: the tokens whose gradient verl's vanilla PPO loss (core_algos.compute_policy_loss_vanilla)
    cuts: the clip is active (its pg_clipfrac: -A clip(r) > -A r) or, for A < 0, the dual clip at
    clip_ratio_c (its pg_clipfrac_lower; Ye et al., arXiv 1912.09729). None without a config."""
    if config is None:
        return None
    eps = config.get("clip_ratio", 0.2)
    low = config.get("clip_ratio_low", None)
    high = config.get("clip_ratio_high", None)
    low, high = eps if low is None else low, eps if high is None else high
    c = config.get("clip_ratio_c", 3.0)
    ratio = torch.exp(torch.clamp(log_prob.detach() - old_log_prob.detach(), -20.0, 20.0))  # [B, T]
    adv = advantages.detach()
    loss1, loss2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high)  # [B, T]
    dual = (adv < 0) & (torch.maximum(loss1, loss2) > -adv * c)  # [B, T]
    return (loss2 > loss1) | dual
