"""A run's training settings in one shape, whatever recorded it: the one place detectors read them from.

    s = settings_of(meta)            # RunSettings; `view.settings` on a RunView
    s.max_new_tokens                 # the length limit of a completion, or None when the run does not say
    s.producer                       # "trainer", "trl", "verl" or "loop": meta_file.origin(meta)
    s.metric("truncated_share")      # the steps column where the producer logs its own value, or None

Each producer stores its configuration its own way: the built-in trainer writes its TrainConfig at the top
of meta.json's `config`, the TRL attach writes GRPOConfig under `config["args"]` (max_completion_length,
num_generations, epsilon, ...), the verl plugin writes what verl's actor config and update batch expose
(tokengrad.integrations.verl.settings: response_length, rollout_n, loss_agg_mode, the clip range,
kl_loss_coef, ppo_epochs, temperature), and a plain loop writes whatever dict it passed to
`Recorder(config=...)`. Whose run it is comes from tokengrad.read.meta_file.origin, the one definition the
dashboard uses too; PRODUCERS maps each origin to RunSettings. An unknown setting stays None so a detector
can say it could not check instead of guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tokengrad.read.meta_file import ORIGINS, origin
from tokengrad.registry import Registry
from tokengrad.schema import SAMPLE, STEP_EXTRA


@dataclass(frozen=True)
class RunSettings:
    producer: str = "loop"  # tokengrad.read.meta_file.origin
    max_new_tokens: int | None = None  # tokens a completion may have before generation stops it
    loss_type: str | None = None  # aggregation: TRL loss_type, trainer aggregation, verl loss_agg_mode
    group_size: int | None = None  # G: completions per prompt
    reward_columns: tuple[str, ...] = ()  # samples columns of the separate reward functions
    temperature: float | None = None  # sampling temperature
    beta: float | None = None  # KL coefficient to the reference model
    num_iterations: int | None = None  # mu: updates per generation batch
    eps_low: float | None = None  # PPO clip range below 1
    eps_high: float | None = None  # ... and above 1
    metrics: Mapping[str, str] = field(default_factory=dict)  # meaning -> steps column the producer logs

    def metric(self, name: str) -> str | None:
        return self.metrics.get(name)


# origin (tokengrad.read.meta_file.ORIGINS) -> fn(config: dict, meta: dict) -> RunSettings
PRODUCERS: Registry = Registry("run producer")


def producer(name: str):
    if name not in ORIGINS:
        raise ValueError(f"a producer is one of meta_file.ORIGINS {ORIGINS}, got {name!r}")
    return PRODUCERS.register(name)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _num(value) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value == value
    return float(value) if ok else None


def _str(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _first(cfg: Mapping, keys: tuple[str, ...], kind):
    for key in keys:
        value = kind(cfg.get(key))
        if value is not None:
            return value
    return None


def _temperature(cfg: Mapping, meta: Mapping) -> float | None:
    return (
        _num(cfg.get("temperature"))
        if _num(cfg.get("temperature")) is not None
        else _num(meta.get("temperature"))
    )


@producer("trl")
def _trl(cfg: dict, meta: dict) -> RunSettings:
    """GRPOConfig under config["args"]; TRL logs its own truncated share as completions/clipped_ratio."""
    args = cfg.get("args") if isinstance(cfg.get("args"), Mapping) else {}
    eps = _num(args.get("epsilon"))
    columns = cfg.get("reward_columns") if isinstance(cfg.get("reward_columns"), list) else []
    return RunSettings(
        producer="trl",
        max_new_tokens=_int(args.get("max_completion_length")),
        loss_type=_str(args.get("loss_type")),
        group_size=_int(args.get("num_generations")),
        reward_columns=tuple(c for c in columns if isinstance(c, str)),
        temperature=_temperature(args, meta),
        beta=_num(args.get("beta")),
        num_iterations=_int(args.get("num_iterations")),
        eps_low=eps,
        eps_high=_num(args.get("epsilon_high")) if args.get("epsilon_high") is not None else eps,
        metrics={"truncated_share": STEP_EXTRA.trl_completions_clipped_ratio},
    )


@producer("verl")
def _verl(cfg: dict, meta: dict) -> RunSettings:
    """What the plugin read from verl's actor config and its update batch (integrations/verl/settings.py);
    beta only where the actor's KL loss is on (a KL in the reward is outside the loss seam)."""
    kl = cfg.get("use_kl_loss")
    return RunSettings(
        producer="verl",
        max_new_tokens=_int(cfg.get("response_length")),
        loss_type=_str(cfg.get("loss_agg_mode")),
        group_size=_int(cfg.get("rollout_n")),
        temperature=_temperature(cfg, meta),
        beta=_num(cfg.get("kl_loss_coef")) if kl is True else None,
        num_iterations=_int(cfg.get("ppo_epochs")),
        eps_low=_num(cfg.get("clip_ratio_low")),
        eps_high=_num(cfg.get("clip_ratio_high")),
    )


@producer("trainer")
def _trainer(cfg: dict, meta: dict) -> RunSettings:
    """The built-in trainer's TrainConfig (tokengrad.train.config), at the top of config."""
    return RunSettings(
        producer="trainer",
        max_new_tokens=_int(cfg.get("max_new_tokens")),
        loss_type=_str(cfg.get("aggregation")),
        group_size=_int(cfg.get("group_size")),
        reward_columns=(SAMPLE.reward,),
        temperature=_temperature(cfg, meta),
        beta=_num(cfg.get("beta")),
        num_iterations=_int(cfg.get("num_iterations")),
        eps_low=_num(cfg.get("eps_low")),
        eps_high=_num(cfg.get("eps_high")),
    )


@producer("loop")
def _loop(cfg: dict, meta: dict) -> RunSettings:
    """A plain loop's config dict: the common names of each setting where the loop used one."""
    return RunSettings(
        producer="loop",
        max_new_tokens=_first(cfg, ("max_new_tokens", "max_completion_length", "response_length"), _int),
        loss_type=_first(cfg, ("loss_type", "aggregation", "loss_agg_mode"), _str),
        group_size=_first(cfg, ("group_size", "num_generations", "G"), _int),
        temperature=_temperature(cfg, meta),
        beta=_first(cfg, ("beta", "kl_coef"), _num),
        num_iterations=_first(cfg, ("num_iterations", "ppo_epochs"), _int),
        eps_low=_first(cfg, ("eps_low", "epsilon", "clip_ratio_low", "clip_ratio"), _num),
        eps_high=_first(cfg, ("eps_high", "epsilon_high", "clip_ratio_high", "clip_ratio"), _num),
    )


def settings_of(meta: Mapping) -> RunSettings:
    """The RunSettings of a run from its meta.json, by its origin (tokengrad.read.meta_file.origin)."""
    cfg = meta.get("config") if isinstance(meta.get("config"), Mapping) else {}
    return PRODUCERS[origin(meta)](dict(cfg), dict(meta))
