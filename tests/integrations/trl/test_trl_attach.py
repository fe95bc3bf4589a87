"""attach() fails fast, in its own words, where a new user's mistake would otherwise fail late or record
wrong numbers silently (a crashing run is never marked finished: tests/integrations/trl/test_trl.py)."""

import threading

import pytest
from transformers import TrainerCallback

trl = pytest.importorskip("trl")

from test_trl import make_trainer  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import trl as tg_trl  # noqa: E402

pytestmark = pytest.mark.trl


def test_directory_holding_this_runs_steps_is_refused_naming_them_and_both_ways_out(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2)
    tg_trl.attach(trainer, tmp_path / "run")
    trainer.train()
    again = make_trainer(tmp_path, max_steps=2)  # the same script run a second time
    with pytest.raises(ValueError) as err:
        tg_trl.attach(again, tmp_path / "run")
    msg = str(err.value)
    assert "steps 0..1" in msg and "new directory" in msg and "resume_step=N" in msg
    assert load_run(tmp_path / "run").steps.step.tolist() == [0, 1]  # nothing lost
    # the way out it names: resuming at step 1 re-records that step only
    with pytest.warns(RuntimeWarning, match="resuming at step 1"):
        tg_trl.attach(again, tmp_path / "run", resume_step=1).detach()
    assert load_run(tmp_path / "run").steps.step.tolist() == [0]


def test_attach_while_train_runs_is_refused(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1)
    seen = []

    class AttachLate(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            try:
                tg_trl.attach(trainer, tmp_path / "late")
            except RuntimeError as err:
                seen.append(str(err))

    trainer.add_callback(AttachLate())
    trainer.train()
    assert seen == ["attach() was called while trainer.train() is running; call attach() before train()"]
    assert not (tmp_path / "late").exists()


def test_attach_from_another_thread_while_train_runs_is_refused(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1)
    started, release, seen = threading.Event(), threading.Event(), []

    class Pause(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            started.set()
            release.wait(30)

    trainer.add_callback(Pause())
    worker = threading.Thread(target=trainer.train)
    worker.start()
    try:
        assert started.wait(60)
        with pytest.raises(RuntimeError, match=r"call attach\(\) before train\(\)"):
            tg_trl.attach(trainer, tmp_path / "late")
    finally:
        release.set()
        worker.join(60)
    seen.append(worker.is_alive())
    assert seen == [False]


def test_unknown_loss_type_is_refused_listing_what_attach_records(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.loss_type = "grpo_plus"  # TRL itself only notices in the first loss, after generation
    with pytest.raises(ValueError) as err:
        tg_trl.attach(trainer, tmp_path / "run")
    msg = str(err.value)
    assert "'grpo_plus'" in msg and "'dapo'" in msg and "'cispo'" in msg and "'vespo'" in msg


@pytest.mark.parametrize(
    "weighting, params, says",
    [
        ("lopti", None, "phases"),
        ("kl_cov", None, "kl_cov_coef"),
        ("ar", {"alpha": "0.5"}, "alpha='0.5' must be a number"),
        ("tr_grpo", {"upper": True}, "upper=True must be a number"),
        ("tr_grpo", {"tau": 1.0}, "has no parameters ['tau']"),
    ],
)
def test_rules_attach_cannot_express_or_mistyped_params_are_refused(tmp_path, weighting, params, says):
    trainer = make_trainer(tmp_path)
    with pytest.raises(ValueError) as err:
        tg_trl.attach(trainer, tmp_path / "run", weighting=weighting, weighting_params=params)
    assert says in str(err.value)
    if weighting in ("lopti", "kl_cov"):  # the list offered holds only rules attach can apply
        offered = str(err.value).split("rules that can:")[1]
        assert "tr_grpo" in offered and "lopti" not in offered and "kl_cov" not in offered
    assert not (tmp_path / "run").exists()


def test_string_interval_is_refused_at_attach(tmp_path):
    trainer = make_trainer(tmp_path)
    with pytest.raises(ValueError, match=r"buckets.every must be an integer >= 0.*'10'"):
        tg_trl.attach(trainer, tmp_path / "run", buckets="10")
    with pytest.raises(ValueError, match=r"attribution.every must be an integer"):
        tg_trl.attach(trainer, tmp_path / "run", attribution="5")
    with pytest.raises(
        TypeError, match=r"^attach\(bucket_every=\.\.\.\) was removed: write attach\(buckets="
    ):
        tg_trl.attach(trainer, tmp_path / "run", bucket_every="10")  # an earlier release's flat keyword
