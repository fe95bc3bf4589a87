"""`tokengrad doctor`: the shipped sample runs have no critical finding, each finding's token evidence
opens a step and sample that exist in the run, and --fail-on / --json / --html do what they say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doctor_runs import write_doctor_run
from test_doctor import kl

from tokengrad.cli import main
from tokengrad.read import load_run

SAMPLE_RUNS = sorted(str(p) for p in Path(__file__).resolve().parents[2].joinpath("sample_runs").iterdir())


@pytest.fixture(scope="module")
def sample_report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("doctor") / "report.json"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["doctor", *SAMPLE_RUNS, "--json", "--fail-on", "critical"])
    out.write_text(buf.getvalue())
    return {"rc": rc, **json.loads(buf.getvalue())}


def test_sample_runs_have_no_critical_finding(sample_report):
    assert len(SAMPLE_RUNS) >= 9  # the shipped runs (docs/sample_runs.md)
    assert sample_report["rc"] == 0
    assert sample_report["counts"]["critical"] == 0
    assert sample_report["counts"]["warning"] > 0  # the lab runs' gradient spikes are real and reported


def test_sample_run_token_evidence_opens_in_the_dashboard(sample_report):
    runs = {Path(p).name: load_run(p) for p in SAMPLE_RUNS}
    checked = 0
    for f in sample_report["findings"]:
        q = f["dashboard"]["query"]
        assert q["runs"] == f["run"] and f["dashboard"]["url"].startswith("http://127.0.0.1:8501/")
        if not f["tokens"]:
            continue
        run = runs[f["run"]]
        hit = run.sql(
            "SELECT count(*) AS n FROM tokens WHERE step = ? AND sample_id = ?",
            [int(q["step"]), int(q["sample"])],
        )["n"].iloc[0]
        assert hit > 0, (f["id"], q)
        checked += 1
    assert checked >= 5


def test_fail_on_and_html(tmp_path, capsys):
    run = str(write_doctor_run(tmp_path / "kl", edit=kl))
    html = tmp_path / "r.html"
    assert main(["doctor", run, "--fail-on", "critical", "--html", str(html)]) == 1
    text = capsys.readouterr().out
    assert "CRIT kl_blowup" in text and "steps 40-59" in text
    page = html.read_text()
    assert "kl_blowup" in page and "<script" not in page
    healthy = str(write_doctor_run(tmp_path / "ok"))
    assert main(["doctor", healthy, "--fail-on", "warning"]) == 0
    assert main(["doctor", run, "--only", "clip_saturation", "--fail-on", "warning"]) == 0


def test_list_and_user_errors(tmp_path, capsys):
    assert main(["doctor", "--list"]) == 0
    assert "gradient_spike" in capsys.readouterr().out
    assert main(["doctor", str(tmp_path / "missing")]) == 2
    assert "is not a tokengrad run" in capsys.readouterr().err
    assert main(["doctor", str(write_doctor_run(tmp_path / "h")), "--only", "nope"]) == 2
    assert "known detectors" in capsys.readouterr().err


def test_watch_prints_each_new_finding_once(tmp_path, capsys):
    run = write_doctor_run(tmp_path / "kl", edit=kl)  # finished: one pass, then exit
    assert main(["watch", str(run), "--interval", "0.1"]) == 0
    out = capsys.readouterr().out
    assert out.count("CRIT kl_blowup") == 1
    assert main(["watch", str(run), "--interval", "0.1", "--fail-on", "critical", "--json"]) == 1
    assert json.loads(capsys.readouterr().out.splitlines()[0])["id"] == "kl_blowup"
    assert main(["watch", str(run), "--interval", "0"]) == 2
