"""The TRL attach under TRL's own logging settings: every optimizer update is recorded whatever
`logging_steps` / `logging_strategy` say, the step's loss, rewards, lr, kl and grad norm from the attach's
own hooks equal what TRL logs when it logs every update, TRL's logged metrics join the step TRL logs at
(naming the updates they cover), and TRL's own log_history is the same with or without the attach."""

import numpy as np
import pytest

trl = pytest.importorskip("trl")

from test_trl import make_trainer  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import trl as tg_trl  # noqa: E402

pytestmark = pytest.mark.trl
N = 2  # optimizer updates per run (one per generation batch with these settings)
TIMING = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time")
OWN = {  # steps column -> TRL's logged name, when TRL logs every update
    "loss": "loss",
    "grad_norm": "grad_norm",
    "lr": "learning_rate",
    "reward_mean": "reward",
    "reward_std": "reward_std",
    "reward_distinct_chars_mean": "rewards/distinct_chars/mean",
    "reward_distinct_chars_std": "rewards/distinct_chars/std",
    "kl": "kl",
    "clip_frac": "clip_ratio/region_mean",
}


def trained(tmp_path, attach: bool, steps: int = N, **overrides):
    """A tiny beta > 0 run (TRL then logs kl): one optimizer update per generation batch."""
    trainer = make_trainer(tmp_path, "grpo", max_steps=steps, beta=0.04, **overrides)
    if attach:
        tg_trl.attach(trainer, tmp_path / "run")
    trainer.train()
    return trainer


def update_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]


def without_timing(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """TRL logging every update, no attach: the reference each recorded value is compared with."""
    return trained(tmp_path_factory.mktemp("ref"), attach=False)


@pytest.mark.parametrize(
    "logging",
    [
        pytest.param({}, id="steps10"),
        pytest.param({"logging_strategy": "no"}, id="no", marks=pytest.mark.slow),
        pytest.param({"logging_strategy": "epoch"}, id="epoch", marks=pytest.mark.slow),
    ],
)
def test_every_update_is_recorded_whatever_trl_logs(tmp_path, plain, logging):
    overrides = {"logging_steps": 10, **logging}  # GRPOConfig's default interval
    trainer = trained(tmp_path, attach=True, **overrides)
    steps = load_run(tmp_path / "run").steps
    every_update = update_logs(plain)
    assert len(every_update) == N and steps.step.tolist() == list(range(N))
    for col, key in OWN.items():  # the attach's own value on every step is TRL's per-update log
        np.testing.assert_allclose(steps[col], [h[key] for h in every_update], rtol=1e-5, atol=1e-9)
    assert steps.trl_global_step.tolist() == list(range(1, N + 1))
    logs = update_logs(trainer)
    if logging.get("logging_strategy") == "epoch":  # one log when training stops: all N updates
        (log,) = logs
        last = steps.iloc[-1]
        assert (last.trl_log_updates, last.trl_log_from_step, last.trl_log_global_step) == (N, 0, N)
        assert last.trl_loss == pytest.approx(np.mean([h["loss"] for h in every_update]), rel=1e-5)
        assert last.trl_reward == pytest.approx(log["reward"]) and steps.trl_loss.iloc[:-1].isna().all()
    else:  # steps: no update reaches 10; "no": TRL never logs
        assert logs == [] and not any(c.startswith("trl_log") for c in steps.columns)
        assert "trl_loss" not in steps.columns


def test_trl_log_history_is_the_same_with_and_without_the_attach(tmp_path, plain):
    attached = trained(tmp_path, attach=True)
    assert len(update_logs(plain)) == N and len(load_run(tmp_path / "run").steps) == N
    assert without_timing(attached.state.log_history) == without_timing(plain.state.log_history)


@pytest.mark.slow
def test_default_interval_joins_trl_log_naming_the_updates_it_covers(tmp_path):
    # 12 updates: TRL logs at update 10, the mean over updates 1..10, which end in tokengrad steps 0..9
    reference = update_logs(trained(tmp_path / "ref", attach=False, steps=12))
    trainer = trained(tmp_path / "attached", attach=True, steps=12, logging_steps=10)
    assert len(update_logs(trainer)) == 1
    steps = load_run(tmp_path / "attached" / "run").steps
    assert steps.step.tolist() == list(range(12))
    np.testing.assert_allclose(steps.loss, [h["loss"] for h in reference], rtol=1e-5, atol=1e-9)
    logged = steps[steps.trl_log_updates.notna()]
    assert logged.step.tolist() == [9]
    row = logged.iloc[0]
    assert (row.trl_log_updates, row.trl_log_from_step, row.trl_log_global_step) == (10, 0, 10)
    # TRL's loss and metrics are its window's means; learning_rate and grad_norm the logged update's own
    for col, key in (("trl_loss", "loss"), ("trl_reward", "reward"), ("trl_kl", "kl")):
        assert row[col] == pytest.approx(np.mean([h[key] for h in reference[:10]]), rel=1e-5), col
    for col, key in (("trl_learning_rate", "learning_rate"), ("trl_grad_norm", "grad_norm")):
        assert row[col] == pytest.approx(reference[9][key], rel=1e-5), col
