"""The trainer's configuration: one flat dataclass, loaded from TOML (or YAML) plus `key=value` overrides.

    cfg = load_config("configs/tiny_charset.toml", ["steps=2", "weighting=ar", "weighting_params.alpha=0.2"])
    cfg = make_config({"task": "countdown", "lr": 1e-5})         # from a dict (the Python API)

Every field carries its default and a one-line meaning (`describe_config()` prints them). Loading checks
the whole config before any work starts: an unknown key, a value of the wrong type, a value out of range
or an unknown registry name (task, weighting rule, aggregation, advantage scale) is a ValueError that
names the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tokengrad.objective.params import check_params
from tokengrad.objective.rule_spec import parse_rules, regroup
from tokengrad.train import config_registries as reg
from tokengrad.train.config_checks import (
    at_least,
    dual_clip,
    importable,
    in_unit,
    known_model,
    one_of,
    positive,
    setting,
)
from tokengrad.train.config_files import read_config_file  # noqa: F401  (importable from here too)
from tokengrad.train.names import registered, weighting_defaults

# Keys renamed since the first release -> (new key, why); the old key is an error naming the new one.
RENAMED = {
    "mu": ("num_iterations", "PPO epochs are named as in TRL; mu is tr_grpo's sigmoid offset"),
    "rollout_correction_cap": ("rollout_correction_clip_max", "TRL 1.16 renamed its _cap to _clip_max"),
}


@dataclass
class TrainConfig:
    # extensions: modules imported before any registry is read (they register rules, tasks, models, ...)
    plugins: list = setting(
        [],
        'modules to import first, e.g. ["my_rules"], whose @register_* decorators extend '
        "the registries (rules, tasks, models, aggregations)",
        importable,
    )
    # what to train
    model: str = setting(
        "tiny", "registered model name or a local transformers checkpoint directory", known_model
    )
    task: str = setting("kk", "registered task name", one_of(reg.tasks))
    task_params: dict = setting({}, "keyword arguments of the task factory, e.g. {n_people = [3, 5]} for kk")
    weighting: str = setting("grpo", "token-weighting rule", one_of(reg.weightings))
    weighting_params: dict = setting(
        {}, "parameters of the weighting rule; unset ones keep the rule's defaults"
    )
    seed: int = setting(
        0,
        "seed of problem order, sampling and the tiny model's weights; same seed = same run on CPU",
        at_least(0),
    )
    steps: int = setting(100, "training steps (one rollout batch each)", at_least(1))
    # rollout
    prompts_per_step: int = setting(8, "B: prompts per step", at_least(1))
    group_size: int = setting(
        8, "G: completions per prompt (>= 2: advantages are relative to the group)", at_least(2)
    )
    n_train_problems: int = setting(
        0, "size of the training problem pool, cycled in epochs; 0 = prompts_per_step * steps", at_least(0)
    )
    max_new_tokens: int = setting(256, "new tokens per generation turn", at_least(1))
    temperature: float = setting(1.0, "sampling temperature (0 = greedy decoding)", at_least(0.0))
    top_p: float = setting(1.0, "nucleus sampling mass, in (0, 1]", in_unit)
    max_turns: int = setting(
        3, "tool tasks: generation turns per completion (each tool answer starts a new turn)", at_least(1)
    )
    # GRPO objective
    adv_scale: str = setting(
        "group",
        "advantage scale: group (GRPO, divide by the group std), batch, none (Dr. GRPO)",
        one_of(reg.adv_scales),
    )
    dynamic_sampling: bool = setting(
        False, "drop groups whose rewards are all equal (DAPO dynamic sampling, arXiv 2503.14476)"
    )
    max_gen_batches: int = setting(
        1,
        "dynamic sampling: generation rounds of prompts_per_step prompts per step, "
        "until prompts_per_step informative groups (verl's max_num_gen_batches; "
        "1 = filter only)",
        at_least(1),
    )
    num_iterations: int = setting(
        1,
        "PPO epochs: passes over the rollout batch per phase (TRL's num_iterations, the GRPO paper's mu)",
        at_least(1),
    )
    mini_batches: int = setting(
        1,
        "PPO mini-batches: optimizer updates per pass, each on a disjoint row subset "
        "(AR-Lopti's K&K runs: 2, Clip-Cov/KL-Cov: 8)",
        at_least(1),
    )
    eps_low: float = setting(0.2, "PPO clip: ratio lower bound 1 - eps_low", at_least(0.0))
    eps_high: float = setting(
        0.2, "PPO clip: ratio upper bound 1 + eps_high (DAPO clip-higher: 0.28)", at_least(0.0)
    )
    clip_ratio_c: float = setting(
        0.0,
        "dual-clip PPO (arXiv 1912.09729): for A < 0 the loss is at most -c A "
        "(0 = off; verl's default 3, AR-Lopti 10); must be > 1",
        dual_clip,
    )
    beta: float = setting(
        0.0, "coefficient of the k3 KL to the frozen initial model (0 = no reference model)", at_least(0.0)
    )
    aggregation: str = setting(
        "grpo", "loss aggregation (what the summed per-token loss is divided by)", one_of(reg.aggregations)
    )
    rollout_correction: str = setting(
        "off",
        "importance-sampling correction of the sampler/trainer gap d = log pi_old - log mu, TRL 1.16's "
        "vllm_importance_sampling_mode (TIS/MIS): weight exp(d) per token or exp(sum d) per sequence, "
        "truncated to the clip range or masked to 0 outside it, times each token's policy term",
        one_of(reg.rollout_corrections),
    )
    rollout_correction_clip_max: float = setting(
        3.0, "C_max of rollout_correction (TRL vllm_importance_sampling_clip_max)", positive
    )
    rollout_correction_clip_min: float = setting(
        0.0, "C_min of rollout_correction (TRL vllm_importance_sampling_clip_min; 0 = none)", at_least(0.0)
    )
    # optimisation
    lr: float = setting(1e-6, "AdamW learning rate", positive)
    weight_decay: float = setting(0.0, "AdamW weight decay", at_least(0.0))
    warmup_steps: int = setting(
        0, "linear learning-rate warm-up over this many steps (0 = none)", at_least(0)
    )
    grad_clip: float = setting(
        1.0, "clip the total gradient norm to this value before each update (0 = off)", at_least(0.0)
    )
    grad_accum: int = setting(1, "micro-batches per optimizer update (gradient accumulation)", at_least(1))
    reuse_old_logprobs: bool = setting(
        True,
        "take log pi_old from the loss pass's own detached log-probs, without the no-grad scoring pass, when "
        "that pass is on-policy: one update per step (num_iterations = 1, mini_batches = 1, no Lopti "
        "phases), a pointwise rule, rollout_correction off (TRL's shortcut); false = always score it",
    )
    bf16: bool = setting(
        False,
        "bf16 autocast for generation and the transformer body (fp32 weights and LM "
        "head); faster only with native bf16 (GPU, avx512_bf16/AMX CPUs), 2-3x slower without",
    )
    device: str = setting(
        "auto", "cpu, cuda, or auto (cuda when available)", one_of(lambda: ("auto", "cpu", "cuda"))
    )
    # evaluation, recording, checkpoints
    eval_every: int = setting(
        0, "held-out evaluation every K steps and after the last step (0 = off)", at_least(0)
    )
    eval_at_start: bool = setting(
        False,
        "also evaluate before the first update (logged as step -1), the "
        "baseline the run's accuracy gain is measured from",
    )
    eval_per_difficulty: int = setting(10, "held-out problems per difficulty level", at_least(1))
    eval_max_new_tokens: int = setting(
        0,
        "new tokens per held-out generation turn (0 = max_new_tokens): evaluation on larger problems "
        "than training needs longer completions",
        at_least(0),
    )
    bucket_every: int = setting(
        0,
        "probability-bucket gradient analysis every N steps (0 = off; one extra backward per bucket)",
        at_least(0),
    )
    whatif: list = setting(
        [],
        "what-if updates: weighting rules (a name, 'tr_grpo:alpha=0.5', or a list) whose gradient from the "
        "same parameters on the same batch is recorded beside the real update (whatif table)",
    )
    whatif_every: int = setting(
        10,
        "what-if updates every N steps when whatif names rules (one extra backward per bucket and rule)",
        at_least(0),
    )
    attribute_every: int = setting(
        0,
        "every N steps each token's exact share of its update (update_share, one "
        "forward-mode pass per micro-batch; 0 = off)",
        at_least(0),
    )
    attribute_method: str = setting(
        "jvp",
        "how update shares are computed: jvp (exact) or central_difference",
        one_of(reg.attribution_methods),
    )
    attribute_entropy: bool = setting(
        False,
        "on attribution steps also each token's share of the change of the mean token entropy "
        "(entropy_share, dentropy_pred, dentropy, Cov(log pi, A); one more backward and directional pass)",
    )
    attribute_on_spike: bool = setting(
        False,
        "also attribute grad-norm spikes (robust z > 3.5) and their norm without the top 1/5/20 tokens",
    )
    token_budget: int = setting(
        0,
        "at most this many token rows per step and rank, aggregates kept exact (0 = record every token)",
        at_least(0),
    )
    checkpoint: bool = setting(
        True,
        "save RUN/checkpoint (weights, tokenizer, optimizer state) after the last step, for resume and reuse",
    )
    checkpoint_every: int = setting(
        0, "also save it every N steps (0 = only after the last step)", at_least(0)
    )
    doctor: str = setting(
        "off",
        "live run doctor (tokengrad.doctor): off, alert (findings to stderr and the trackers) or halt (also "
        "stop with a checkpoint after a critical finding)",
        one_of(lambda: ("alert", "halt", "off")),
    )
    run_dir: str = setting("", "run directory; empty = runs/<run_name>")
    run_name: str = setting("", "run name; empty = <task>-<weighting>-<time>")
    resume: bool = setting(False, "continue the run in run_dir from its checkpoint")
    progress: bool = setting(True, "show a progress bar with the live reward and grad-norm")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(TrainConfig)}
REGISTRY_KEYS = {
    "task": reg.tasks,
    "weighting": reg.weightings,
    "aggregation": reg.aggregations,
    "adv_scale": reg.adv_scales,
    "rollout_correction": reg.rollout_corrections,
}
DICT_FIELDS = tuple(name for name, f in FIELDS.items() if f.type in ("dict", dict))


def describe_config() -> str:
    """Name, default and meaning of every key (for `tokengrad train --help` and the docs); keys that name a
    registry entry list the registered names, so plugins show up too."""
    default = TrainConfig()
    lines = []
    for name, f in FIELDS.items():
        lines.append(f"  {name} = {getattr(default, name)!r}\n      {f.metadata['doc']}")
        registry = REGISTRY_KEYS.get(name)
        if registry is not None:
            lines.append(f"      one of: {', '.join(sorted(registry()))}")
    return "\n".join(lines)


def load_config(
    path: str | os.PathLike | None = None, overrides: Sequence[str] | Mapping[str, Any] = ()
) -> TrainConfig:
    """Read a flat TOML/YAML file (or none), apply overrides (`key=value` strings or a dict), validate."""
    values = read_config_file(path) if path is not None else {}
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            _set(values, key, value)
    else:
        for item in overrides:
            key, value = parse_override(item)
            _set(values, key, value)
    return make_config(values)


def parse_override(item: str) -> tuple[str, Any]:
    """'key=value' -> (key, value). The value is read as a TOML value (3, 1e-5, true, "x", {a = 1}) and
    kept as the raw string when it is not one (task=kk, model=/path); string keys always stay raw."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"override {item!r} must look like key=value")
    top = key.split(".", 1)[0]
    if top in FIELDS and FIELDS[top].type in ("str", str):
        return key, raw
    try:
        return key, tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return key, raw


def _set(values: dict, key: str, value: Any) -> None:
    """values[key] = value; 'task_params.x' sets one entry of a dict-valued key."""
    top, dot, sub = key.partition(".")
    if dot:
        if top not in DICT_FIELDS:
            raise ValueError(f"override {key!r}: only {list(DICT_FIELDS)} take dotted keys")
        values[top] = {**(values.get(top) or {}), sub: value}
    else:
        values[key] = value


def make_config(values: Mapping[str, Any]) -> TrainConfig:
    """A validated TrainConfig from a flat mapping; every problem found is a ValueError naming its key."""
    renamed = [k for k in values if k in RENAMED]
    if renamed:
        k = renamed[0]
        raise ValueError(f"config key {k!r} is now {RENAMED[k][0]!r} ({RENAMED[k][1]})")
    unknown = [k for k in values if k not in FIELDS]
    if unknown:
        hints = {k: difflib.get_close_matches(k, FIELDS, n=1) for k in unknown}
        listed = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
        raise ValueError(f"unknown config key(s) {listed}; known keys: {sorted(FIELDS)}")
    clean = {k: _coerce(k, v) for k, v in values.items()}
    cfg = TrainConfig(**clean)
    for name, f in FIELDS.items():  # plugins first: its imports fill the registries the later checks read
        check = f.metadata["check"]
        problem = check(getattr(cfg, name)) if check else None
        if problem:
            raise ValueError(f"config key {name!r} = {getattr(cfg, name)!r}: {problem}")
    _check_weighting_params(cfg)
    _check_whatif(cfg)
    if cfg.rollout_correction_clip_min >= cfg.rollout_correction_clip_max:
        raise ValueError(
            f"config key 'rollout_correction_clip_min' = {cfg.rollout_correction_clip_min!r} must be below "
            f"rollout_correction_clip_max = {cfg.rollout_correction_clip_max!r}"
        )
    return cfg


_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "dict": dict, "list": list}


def _coerce(key: str, value: Any) -> Any:
    want = _TYPES[FIELDS[key].type if isinstance(FIELDS[key].type, str) else FIELDS[key].type.__name__]
    if want is list and isinstance(value, str):  # plugins=my_rules,other on the command line
        value = [v.strip() for v in value.split(",") if v.strip()]
    ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if want is float and isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"config key {key!r} must be a finite number, got {value!r}")
    if not ok:
        raise ValueError(f"config key {key!r} must be {want.__name__}, got {type(value).__name__} {value!r}")
    return want(value) if want in (dict, list) else value


def _check_whatif(cfg: TrainConfig) -> None:
    """The what-if rules checked, and kept as one entry per rule (a command line splits at every comma)."""
    try:
        parse_rules(cfg.whatif, known=registered("weighting"), defaults=weighting_defaults)
    except ValueError as err:
        raise ValueError(f"config key 'whatif': {err}") from None
    cfg.whatif = regroup(cfg.whatif)


def _check_weighting_params(cfg: TrainConfig) -> None:
    try:
        check_params(cfg.weighting, cfg.weighting_params, weighting_defaults(cfg.weighting))
    except ValueError as err:
        raise ValueError(f"config key 'weighting_params': {err}") from None
