"""One diagnosis whatever recorded the run: the same pathology, made through the built-in trainer, the TRL
attach and a plain Recorder loop, gets the same finding id and severity from the doctor (the table:
tests/conformance_cases.py, which tests/integrations/verl/test_verl_conformance.py reads for the verl plugin).

Each producer writes its run its own way: the trainer's TrainConfig at the top of `config`, TRL's
GRPOConfig under `config["args"]` and TRL's own metric names (through the attach's log mapping,
tokengrad.integrations.trl.logs), a plain loop whatever dict it passes. The controlled cases write each
pathology's per-step values through the producer's recording surfaces (its config, its metric names, its
samples columns); the real cases train a tiny model through each producer, where that is fast on CPU.
"""

from __future__ import annotations

import math
import warnings

import pytest
from conformance_cases import CASES, LIMIT, N_STEPS, PROMPTS, G, expected

from tokengrad.doctor.engine import examine
from tokengrad.record import Recorder, RunInfo


def _scalars(step: int, case: str) -> dict:
    """A healthy step's scalars (tokengrad names), with the case's pathology from step 2 on."""
    x = dict(
        loss=0.01 * math.sin(step),
        grad_norm=1.0 + 0.1 * math.cos(step),
        entropy_mean=0.5 + 0.01 * math.sin(3 * step),
        clip_frac=0.05,
        reward_mean=0.5,
        reward_std=0.45,
    )
    bad = step >= 2
    if case == "nan_loss" and step == 12:
        x["loss"] = float("nan")
    if case == "dead_steps" and bad:
        x["grad_norm"] = 0.0
    if case == "constant_reward" and bad:
        x["reward_std"] = 0.0
    if case == "entropy_collapse":
        x["entropy_mean"] = 0.5 * 0.8**step
    if case == "clip_saturation" and bad:
        x["clip_frac"] = 0.7
    return x


def _samples(step: int, case: str) -> dict:
    """The step's completions: healthy ones end early with varied rewards; the case changes them."""
    n = G * PROMPTS
    rewards = [float((i + step) % 3 == 0) for i in range(n)]  # groups disagree: advantages not all 0
    lengths = [3 + (i % 4) for i in range(n)]
    if case == "truncation" and step >= 2:
        lengths = [LIMIT] * n
    if case == "nan_reward" and step >= 2:
        rewards = [float("nan") if i % 2 else r for i, r in enumerate(rewards)]
    if case == "constant_reward" and step >= 2:
        rewards = [1.0] * n
    return dict(
        sample_ids=list(range(n)),
        group_ids=[i // G for i in range(n)],
        prompts=[f"p{i // G}" for i in range(n)],
        completions=[" ".join(f"w{(7 * i + k) % 13}" for k in range(m)) for i, m in enumerate(lengths)],
        rewards=rewards,
        lengths=lengths,
    )


# ---- each producer's recording surfaces ------------------------------------------------------------
def _trainer_config() -> dict:
    from tokengrad.train.config import TrainConfig

    cfg = TrainConfig(model="tiny", task="arithmetic", group_size=G, prompts_per_step=PROMPTS)
    return {**cfg.to_dict(), "max_new_tokens": LIMIT}


@pytest.fixture(scope="module")
def trl_config(tmp_path_factory):
    """The config a real attach writes for a tiny GRPOTrainer with max_completion_length = LIMIT."""
    pytest.importorskip("trl")
    import trl
    from test_trl import make_trainer

    from tokengrad.integrations.trl import _run_config

    trainer = make_trainer(tmp_path_factory.mktemp("trl"), num_generations=G, max_completion_length=LIMIT)
    return _run_config(trainer, trl.__version__)


def _trl_logs(x: dict, samples: dict) -> dict:
    """The step's scalars as the attach writes them: its own loss, rewards and clip share
    (integrations/trl/step_values.py), TRL's logged metrics as trl_* through its mapping (StepLogs)."""
    from tokengrad.integrations.trl.logs import StepLogs

    truncated = sum(n >= LIMIT for n in samples["lengths"]) / len(samples["lengths"])
    logs = {
        "loss": x["loss"],
        "reward": x["reward_mean"],
        "reward_std": x["reward_std"],
        "clip_ratio/region_mean": x["clip_frac"],
        "completions/clipped_ratio": truncated,
    }
    own = {k: x[k] for k in ("loss", "reward_mean", "reward_std", "clip_frac")}
    # the recorder measures these itself (record_grad_norms, the tracked log-probs' entropy)
    return {**StepLogs().add(1, logs), **own, "grad_norm": x["grad_norm"], "entropy_mean": x["entropy_mean"]}


def _trl_samples(samples: dict) -> dict:
    return {**samples, "reward_distinct_chars": samples["rewards"]}  # the one reward function's column


def write_run(producer: str, run_dir, case: str, trl_config: dict | None = None) -> None:
    config = {
        "trainer": _trainer_config,
        "trl": lambda: trl_config,
        "loop": lambda: {"max_new_tokens": LIMIT, "lr": 1e-3},
    }[producer]()
    with Recorder(run_dir, config=config, info=RunInfo(temperature=1.0)) as rec:
        for step in range(N_STEPS):
            x, samples = _scalars(step, case), _samples(step, case)
            with rec.step(step) as st:
                st.log(**(_trl_logs(x, samples) if producer == "trl" else x))
                st.samples(**(_trl_samples(samples) if producer == "trl" else samples))


@pytest.mark.parametrize("case", CASES)
def test_same_pathology_same_finding_from_every_producer(tmp_path, case, request):
    trl_cfg = request.getfixturevalue("trl_config") if _has_trl() else None
    want = expected(case)
    got = {}
    for producer in ("trainer", "trl", "loop") if trl_cfg else ("trainer", "loop"):
        write_run(producer, tmp_path / producer, case, trl_cfg)
        result = examine(tmp_path / producer)
        got[producer] = {(f.id, f.severity) for f in result.findings}
        assert want in got[producer], (producer, got[producer], [str(n) for n in result.not_checked])
    # and nothing of the pathology's detector is left unchecked on any producer
    assert len({frozenset(g & {want}) for g in got.values()}) == 1


def test_healthy_controlled_run_has_no_pathology_finding(tmp_path):
    write_run("loop", tmp_path / "ok", "healthy")
    assert not [f for f in examine(tmp_path / "ok").findings if f.at_least("warning")]


def _has_trl() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


# ---- the settings each producer's config maps to ------------------------------------------------------
def test_every_producer_maps_its_config_to_the_same_settings(tmp_path, trl_config):
    from tokengrad.doctor.view import RunView

    for producer in ("trainer", "trl", "loop"):
        write_run(producer, tmp_path / producer, "healthy", trl_config)
    s = {p: RunView.open(tmp_path / p).settings for p in ("trainer", "trl", "loop")}
    assert {p: v.producer for p, v in s.items()} == {p: p for p in s}
    assert {v.max_new_tokens for v in s.values()} == {LIMIT}
    assert s["trainer"].group_size == s["trl"].group_size == G and s["loop"].group_size is None
    assert s["trl"].loss_type == "dapo" and s["trl"].beta == 0.0 and s["trl"].num_iterations == 1
    assert s["trl"].reward_columns == ("reward_distinct_chars",)
    assert s["trl"].metric("truncated_share") == "trl_completions_clipped_ratio"
    assert s["trainer"].eps_low == 0.2 and s["trainer"].reward_columns == ("reward",)


def test_a_detector_that_cannot_run_says_why_in_text_json_and_html(tmp_path):
    from tokengrad.doctor.report import as_html, as_json, as_text

    with Recorder(tmp_path / "plain", config={"lr": 1e-3}) as rec:  # no length limit, no entropy
        for step in range(6):
            with rec.step(step) as st:
                st.log(loss=0.1, grad_norm=1.0, reward_std=0.4)
                st.samples(**_samples(step, "truncation"))
    result = examine(tmp_path / "plain")
    why = {n.detector: n.reason for n in result.not_checked}
    assert why["truncation"] == "the length limit is unknown (no max_new_tokens in the run's settings)"
    assert why["entropy_collapse"] == "the run records no token entropy (entropy_mean)"
    assert "truncation" not in {f.id for f in result.findings}
    text = as_text(result.findings, not_checked=result.not_checked)
    assert "skip truncation: not checked, the length limit is unknown" in text
    js = as_json(result.findings, ["plain"], not_checked=result.not_checked)
    assert {"detector": "truncation", "run": "plain", "reason": why["truncation"]} in js["not_checked"]
    assert "truncation: not checked" in as_html(result.findings, ["plain"], not_checked=result.not_checked)


# ---- real training through each producer -------------------------------------------------------------
@pytest.mark.trl
@pytest.mark.slow  # about 9 s: 7 TRL steps
def test_trl_truncation_nan_reward_and_a_second_train_continue_the_run(tmp_path, capfd):
    pytest.importorskip("trl")
    from test_trl import distinct_chars, make_trainer

    from tokengrad import load_run
    from tokengrad.integrations import trl as tg_trl

    def unscored_abc(prompts, completions, **kwargs):  # TRL's contract: None = cannot score this one
        return [None if p == "abc" else r for p, r in zip(prompts, distinct_chars(completions))]

    # 4 new tokens of a tiny random model: no end token, every completion truncated (the run)
    trainer = make_trainer(tmp_path, reward_funcs=(unscored_abc,), max_steps=5, max_completion_length=4)
    tg_trl.attach(trainer, tmp_path / "run")
    err = capfd.readouterr().err
    assert f"recording to {tmp_path / 'run'}" in err and f"tokengrad dashboard {tmp_path}" in err
    trainer.train()
    run = load_run(tmp_path / "run")
    assert run.steps.step.tolist() == list(range(5))
    assert run.steps["trl_completions_clipped_ratio"].min() >= 0.75
    abc = run.samples[run.samples.prompt == "abc"]
    assert len(abc) and abc.reward.isna().all()  # kept NaN, not TRL's nansum of 0
    assert run.samples[run.samples.prompt != "abc"].reward.notna().all()
    found = {(f.id, f.severity) for f in examine(tmp_path / "run").findings}
    assert ("truncation", "critical") in found
    assert capfd.readouterr().err.count("tokengrad:") == 0  # one line at attach, none per step

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trainer.args.max_steps = 2
        trainer.train()  # the same trainer again: the run goes on after step 4
    run = load_run(tmp_path / "run")
    assert run.steps.step.tolist() == list(range(7)) and run.meta["finished"] is True
    assert "the run goes on from step 5" in capfd.readouterr().err


@pytest.mark.trl
def test_attach_after_a_finished_train_replaces_the_continuation(tmp_path):
    pytest.importorskip("trl")
    from test_trl import make_trainer

    from tokengrad import load_run
    from tokengrad.integrations import trl as tg_trl

    trainer = make_trainer(tmp_path, max_steps=1)
    tg_trl.attach(trainer, tmp_path / "first")
    trainer.train()
    tg_trl.attach(trainer, tmp_path / "second")  # a new run for the next training
    trainer.train()
    assert load_run(tmp_path / "first").steps.step.tolist() == [0]
    assert load_run(tmp_path / "second").steps.step.tolist() == [0]
    trainer.train()  # and that one continues
    assert load_run(tmp_path / "second").steps.step.tolist() == [0, 1]
    assert load_run(tmp_path / "first").steps.step.tolist() == [0]


@pytest.mark.slow  # about 25 s: the tiny model trains 5 steps
def test_builtin_trainer_truncation_and_unscored_completions(tmp_path, monkeypatch):
    from letters_task import LettersTask

    from tokengrad import load_run
    from tokengrad.train.trainer import train

    real = LettersTask.reward
    # every second completion cannot be scored: the task returns None
    calls = iter(range(10**6))
    monkeypatch.setattr(
        LettersTask, "reward", lambda self, p, c: None if next(calls) % 2 else real(self, p, c)
    )
    monkeypatch.setattr(LettersTask, "is_correct", lambda self, p, c: real(self, p, c) > 0.2)
    cfg = dict(
        model="tiny",
        task="letters",
        steps=5,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=4,
        lr=1e-2,
        bf16=False,
        progress=False,
        eval_every=0,
        run_dir=str(tmp_path / "run"),
    )
    train(cfg)
    run = load_run(tmp_path / "run")
    s = run.samples
    assert s.reward.isna().any() and s.reward.notna().any()
    assert (s[s.reward.isna()].advantage == 0).all()  # unscored: neither rewarded nor penalised
    assert ("truncation", "critical") in {(f.id, f.severity) for f in examine(tmp_path / "run").findings}
