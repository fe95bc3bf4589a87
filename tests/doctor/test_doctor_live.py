"""The live doctor: findings on committed steps reach the user's callable and the trackers, and
Doctor(halt=True) stops a plain loop at the next step boundary with DoctorHalt."""

from __future__ import annotations

import re

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


@pytest.mark.filterwarnings("ignore:doctor alert")
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
        return [
            Finding(
                id="test_critical",
                severity="critical",
                confidence=1.0,
                first_step=2,
                last_step=2,
                message="step 2 is critical (test)",
            )
        ]

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
    # the tiny run also truncates every completion: which critical finding the live diagnosis reaches
    # first (test_critical or truncation) depends on the machine's load; the stop names that one
    stop = re.search(rf"the doctor stopped the run after step {steps[-1]}: (\w+)", err)
    assert stop and stop.group(1) in {"test_critical", "truncation"}
    assert f"tokengrad doctor: critical {stop.group(1)}" in err


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


def _bad_loss_loop(rec: Recorder, n: int, bad_from: int, bad: float, drain: bool = True) -> list[int]:
    done = []
    for step in range(n):
        with rec.step(step) as st:
            st.log(loss=bad if step >= bad_from else 0.1, reward_mean=0.5)
        if drain:
            rec.live_doctor.drain(30)
        done.append(step)
    return done


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_inf_loss_halts_and_every_finished_step_is_on_disk(tmp_path, bad):
    from tokengrad.read import load_run

    rec = Recorder(tmp_path / "run", doctor=Doctor(halt=True, detectors=("nonfinite",)))
    done: list[int] = []
    with pytest.raises(DoctorHalt) as err:
        with rec:
            done += _bad_loss_loop(rec, 40, 6, bad)
    f = err.value.finding
    assert (f.id, f.severity, f.first_step) == ("nonfinite", "critical", 6)
    assert f.evidence["values"]["loss"] == 1
    # step 6 logged the bad loss: it is diagnosed once on disk, and the boundary before step 7 raises
    run = load_run(tmp_path / "run")
    assert run.steps["step"].tolist() == list(range(7))
    assert np.isnan(run.steps["loss"][6]) or np.isinf(run.steps["loss"][6])
    assert run.meta["finished"] is False  # the halt ended the run by an exception


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_loss_halts_at_the_very_next_step_boundary_without_waiting(tmp_path, bad):
    """A loop that never waits for the doctor: the step that logged a non-finite loss is diagnosed as
    soon as it is on disk, so begin_step of the next step raises and no step after it runs."""
    from tokengrad.read import load_run

    rec = Recorder(tmp_path / "run", doctor=Doctor(halt=True, detectors=("nonfinite",)))
    done: list[int] = []
    with pytest.raises(DoctorHalt) as err:
        with rec:
            for step in range(40):
                with rec.step(step) as st:
                    st.log(loss=bad if step >= 6 else 0.1, reward_mean=0.5)
                done.append(step)
    assert done == list(range(7))  # step 6 finished; step 7 never began
    assert (err.value.finding.id, err.value.finding.first_step) == ("nonfinite", 6)
    assert load_run(tmp_path / "run").steps["step"].tolist() == list(range(7))


def test_a_loss_that_was_never_logged_is_not_nonfinite(tmp_path):
    from tokengrad.doctor import diagnose

    with Recorder(tmp_path / "run") as rec:
        for step in range(5):
            with rec.step(step) as st:
                st.log(reward_mean=0.5)  # no loss: null in the table, not NaN
    assert diagnose(tmp_path / "run", only=["nonfinite"]) == []


@pytest.fixture
def slow_detector():
    """A detector that blocks (until the test ends) on every diagnosis from step `at` on."""
    import threading

    from tokengrad.doctor import DETECTORS
    from tokengrad.doctor.engine import load_detectors
    from tokengrad.doctor.registry import detector

    load_detectors()
    release = threading.Event()
    at = {"step": 0}

    @detector("test_hang")
    def test_hang(view):
        if view.upto is not None and view.upto >= at["step"]:
            release.wait(120)
        return []

    yield at
    release.set()
    DETECTORS.unregister("test_hang")


def test_a_hung_detector_is_named_and_the_others_still_halt(tmp_path, slow_detector):
    import time

    from tokengrad.doctor.live import DoctorWarning

    doctor = Doctor(halt=True, detectors=("test_hang", "nonfinite"), detector_timeout=0.5)
    rec = Recorder(tmp_path / "run", doctor=doctor)
    with pytest.warns(DoctorWarning, match="'test_hang' did not return within 0.5 s"):
        with pytest.raises(DoctorHalt) as err:
            with rec:
                _bad_loss_loop(rec, 40, 3, float("inf"))
        t0 = time.perf_counter()
        rec.close()
        assert time.perf_counter() - t0 < 10  # skipped while it hangs: close does not wait for it
    assert err.value.finding.id == "nonfinite"
    assert any("test_hang" in e for e in rec.live_doctor.errors)


def test_close_is_bounded_when_the_last_diagnosis_hangs(tmp_path, slow_detector):
    import time

    from tokengrad.doctor.live import DoctorWarning

    slow_detector["step"] = 5  # only the final diagnosis (of step 5, at close) blocks
    doctor = Doctor(detectors=("test_hang", "nonfinite"), close_timeout=1.0)
    with pytest.warns(DoctorWarning, match="did not finish within 1 s at close .detector 'test_hang'"):
        with Recorder(tmp_path / "run", doctor=doctor) as rec:
            for step in range(6):
                with rec.step(step) as st:
                    st.log(loss=0.1)
                rec.live_doctor.drain(30)
            t0 = time.perf_counter()
        elapsed = time.perf_counter() - t0
    assert elapsed < 10  # a behaviour check (1 s asked), not a benchmark
    from tokengrad.read import load_run

    assert load_run(tmp_path / "run").meta["finished"] is True  # meta.json is written after the doctor


def test_a_raising_detector_is_named_and_the_others_still_run(tmp_path):
    from tokengrad.doctor import DETECTORS
    from tokengrad.doctor.live import DoctorWarning
    from tokengrad.doctor.registry import detector

    @detector("test_boom")
    def test_boom(view):
        raise RuntimeError("exploded")

    seen: list = []
    try:
        doctor = Doctor(on_finding=seen.append, detectors=("test_boom", "kl_blowup"))
        with pytest.warns(DoctorWarning, match="detector test_boom could not read this run: RuntimeError"):
            with Recorder(tmp_path / "run", doctor=doctor) as rec:
                _loop(rec, 20)
    finally:
        DETECTORS.unregister("test_boom")
    assert [f.id for f in seen] == ["kl_blowup"]
    assert sum("test_boom" in e for e in rec.live_doctor.errors) == 20  # kept each time, warned once


def test_doctor_timeouts_are_checked():
    with pytest.raises(ValueError, match="detector_timeout"):
        Doctor(detector_timeout=0)
    with pytest.raises(ValueError, match="close_timeout"):
        Doctor(close_timeout=float("nan"))
