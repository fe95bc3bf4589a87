"""The live doctor: findings on committed steps reach the user's callable and the trackers, and
Doctor(halt=True) stops a plain loop at the next step boundary with DoctorHalt."""

from __future__ import annotations

import numpy as np
import pytest

from tokengrad.integrations.trackers.backends import Tracker
from tokengrad.record import Recorder
from tokengrad.record.options import Doctor, DoctorHalt, as_doctor


class Alerts(Tracker):
    """A tracker that keeps its alerts (and ignores scalars)."""

    def __init__(self):
        super().__init__()
        self.alerts: list[tuple] = []

    def _open(self):
        pass

    def _write(self, step, values):
        pass

    def _close(self):
        pass

    def _alert(self, title, text, level, step):
        self.alerts.append((title, level, step, text))


def _kl(step: int) -> float:
    return 2.0 if step >= 12 else 0.02 + 0.001 * (step % 3)  # blows up at step 12


def _loop(rec: Recorder, n: int, drain: bool = True) -> list[int]:
    done = []
    for step in range(n):
        with rec.step(step) as st:
            st.log(kl=_kl(step), loss=0.0, reward_mean=0.5, reward_std=0.4)
        if drain:
            rec.live_doctor.drain(30)  # deterministic for the test: the diagnosis of the committed steps
        done.append(step)
    return done


def test_findings_reach_the_callable_and_the_trackers(tmp_path):
    seen, tracker = [], Alerts()
    from tokengrad.doctor.engine import load_detectors
    from tokengrad.doctor.registry import DETECTORS
    from tokengrad.record.options import Output

    # every detector but throughput_decay, which reads the wall-clock step time of this very loop (on a
    # loaded machine its steps slow down and it rightly warns; that finding is not what this test is about)
    load_detectors()
    names = tuple(n for n in DETECTORS if n != "throughput_decay")
    assert "kl_blowup" in names and len(names) >= 20
    doctor = Doctor(on_finding=seen.append, detectors=names)
    with Recorder(tmp_path / "run", doctor=doctor, output=Output(trackers=[tracker])) as rec:
        _loop(rec, 20)
    kl = [f for f in seen if f.id == "kl_blowup"]
    assert len(kl) == 1 and kl[0].first_step == 12 and kl[0].severity == "critical"  # alerted once
    assert [a[:2] for a in tracker.alerts] == [("tokengrad doctor: kl_blowup (critical)", "critical")]
    assert "above 1 nats for" in tracker.alerts[0][3]
    assert rec.live_doctor.errors == []


def test_halt_stops_a_plain_loop_at_the_step_boundary(tmp_path):
    rec = Recorder(tmp_path / "run", doctor=Doctor(halt=True))
    done: list[int] = []
    with pytest.raises(DoctorHalt) as err:
        with rec:
            for step in range(40):
                with rec.step(step) as st:
                    st.log(kl=_kl(step))
                rec.live_doctor.drain(30)
                done.append(step)
    assert err.value.finding.id == "kl_blowup"
    # KL is 2 nats from step 12: a streak of s steps has confidence 1 - 0.5^(s/3) e^-1, >= 0.9 (the
    # default min_confidence) from s = 6, i.e. once step 17 is committed, which the recorder reports at
    # the end of step 18; the boundary before step 19 raises
    assert done[-1] == 18
    assert err.value.finding.confidence == pytest.approx(1 - 0.5**2 * np.exp(-1))
    from tokengrad.read import load_run

    assert load_run(tmp_path / "run").steps["step"].max() == 18  # every finished step is on disk


def test_without_halt_the_loop_runs_on_and_low_confidence_is_not_alerted(tmp_path):
    seen = []
    with Recorder(tmp_path / "run", doctor=Doctor(on_finding=seen.append, min_confidence=1.0)) as rec:
        assert _loop(rec, 20) == list(range(20))
    assert seen == []  # the KL finding's confidence 1 - 0.5^(s/3) e^-1 stays below 1


@pytest.mark.filterwarnings("ignore:doctor alert:RuntimeWarning")
def test_a_failing_callable_is_reported_not_raised(tmp_path):
    def broken(f):
        raise RuntimeError("webhook down")

    with Recorder(tmp_path / "run", doctor=Doctor(on_finding=broken, min_confidence=0.5)) as rec:
        _loop(rec, 16)  # the run goes on; the failure is kept (and warned on the doctor's thread)
    assert any("webhook down" in e for e in rec.live_doctor.errors)


def test_doctor_options_are_checked(tmp_path):
    assert as_doctor(True) == Doctor() and as_doctor(False) is None
    with pytest.raises(ValueError, match="min_confidence"):
        Doctor(min_confidence=2)
    with pytest.raises(ValueError, match="alert_on"):
        Doctor(alert_on="loud")
    with pytest.raises(ValueError, match="known detectors"):
        Recorder(tmp_path / "run", doctor=Doctor(detectors=["nope"])).open()
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.fixture
def critical_from_step_2():
    """A detector that reports a critical finding once step 2 is committed (drives the halt path)."""
    from tokengrad.doctor import DETECTORS, Finding
    from tokengrad.doctor.engine import load_detectors
    from tokengrad.doctor.registry import detector

    load_detectors()

    @detector("test_critical")
    def test_critical(view):
        steps = view.steps
        if steps.empty or steps["step"].max() < 2:
            return []
        return [Finding("test_critical", "critical", 1.0, 2, 2, "step 2 is critical (test)")]

    yield
    DETECTORS.unregister("test_critical")


def test_builtin_trainer_stops_cleanly_with_a_checkpoint(tmp_path, capsys, critical_from_step_2):
    from test_trainer import tiny

    from tokengrad.read import load_run
    from tokengrad.train.checkpoint import load_trainer_state
    from tokengrad.train.trainer import train

    run = train(**tiny(tmp_path, steps=40, doctor="halt"))
    steps = load_run(run).steps["step"].tolist()
    assert 3 <= len(steps) < 40 and steps == list(range(len(steps)))  # stopped early, no step lost
    state = load_trainer_state(run)
    assert state["step"] == steps[-1] and state["data_step"] == steps[-1]  # of the last finished step
    err = capsys.readouterr().err
    assert f"the doctor stopped the run after step {steps[-1]}: test_critical" in err
    assert "tokengrad doctor: critical test_critical" in err


@pytest.mark.trl
def test_trl_attach_stops_through_should_training_stop(tmp_path, critical_from_step_2):
    pytest.importorskip("trl")
    from test_trl import make_trainer

    import tokengrad.integrations.trl as tg_trl
    from tokengrad.read import load_run

    trainer = make_trainer(tmp_path, "grpo", max_steps=60)
    rec = tg_trl.attach(trainer, tmp_path / "run", doctor=Doctor(halt=True))
    trainer.train()  # returns normally: TRL stopped itself
    steps = load_run(tmp_path / "run").steps["step"].tolist()
    assert 3 <= trainer.state.global_step < 60 and steps == list(range(len(steps)))
    assert rec.recorder is None  # detached: the recorder closed after TRL's stop
