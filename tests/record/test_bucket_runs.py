"""Runs in a bucket against a real S3-compatible server (moto's, on 127.0.0.1): recorded through the staging
folder and the uploader, read back from the bucket, bad URLs refused in one line, the network failing."""

from __future__ import annotations

import json
import threading

import boto3
import pytest
from test_reliability import record, step_counts

from tokengrad import faults, load_run
from tokengrad.read.remote import RemoteError, parse_url
from tokengrad.record.options import Output, RunInfo
from tokengrad.record.recorder import Recorder
from tokengrad.record.store import bucket_claim
from tokengrad.record.store.claim import RunClaimedError


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch, tmp_path):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reset()
    monkeypatch.chdir(tmp_path)  # where a folder named `s3:` would appear


def keys(url: str) -> list[str]:
    u = parse_url(url)
    got = boto3.client("s3").list_objects_v2(Bucket=u.bucket, Prefix=u.key)
    return sorted(o["Key"][len(u.key) + 1 :] for o in got.get("Contents", []))


def values(run) -> dict:
    return {
        **step_counts(run),
        "loss": run.steps["loss"].tolist(),
        "tokens_rows": run.sql(
            "SELECT step, sample_id, position, token_id, prob, coef FROM tokens "
            "ORDER BY step, sample_id, position"
        ).values.tolist(),
        "rewards": run.samples["reward"].tolist(),
        "evals": run.evals["accuracy"].tolist(),
    }


def test_a_run_recorded_into_a_bucket_reads_back_equal_to_a_local_run(bucket, tmp_path):
    url = f"{bucket}/runs/demo"
    record(tmp_path / "demo", range(5))
    record(url, range(5))
    local, remote = load_run(tmp_path / "demo"), load_run(url)
    assert values(remote) == values(local)
    assert len(values(local)["tokens_rows"]) == 5 * 8
    assert remote.name == "demo" and remote.meta["finished"] is True
    held = keys(url)
    assert "meta.json" in held and "ranks/rank000.json" in held and "ranks/rank000.lock" not in held
    assert any(k.startswith("tokens/rank000/s") for k in held)
    status = json.loads((remote.path / "ranks" / "rank000.json").read_text())
    assert status["upload"]["files_not_uploaded"] == 0 and status["upload"]["url"] == url
    assert not list(tmp_path.glob("s3*"))


@pytest.mark.parametrize(
    "url, words",
    [
        ("ftp://host/runs/demo", "unknown URL scheme 'ftp'"),
        ("s3:///runs/demo", "no bucket named"),
        ("s3://no-such-bucket-here/runs/demo", "the bucket 'no-such-bucket-here' does not exist"),
    ],
)
def test_bad_urls_are_one_line_naming_the_url_and_create_nothing(bucket, tmp_path, url, words):
    for action in (lambda: Recorder(url).open(), lambda: load_run(url)):
        with pytest.raises(RemoteError) as err:
            action()
        text = str(err.value)
        assert words in text and "\n" not in text and text.startswith(url.split("://")[0])
    assert list(tmp_path.iterdir()) == [tmp_path / "cache"] or not list(tmp_path.iterdir())


def test_an_unreachable_endpoint_is_named(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(RemoteError, match=r"s3://tgruns/r: the endpoint cannot be reached"):
        load_run("s3://tgruns/r")
    with pytest.raises(RemoteError, match=r"the endpoint cannot be reached"):
        Recorder("s3://tgruns/r").open()
    assert not list(tmp_path.glob("s3*"))


def test_a_run_that_is_not_there_is_named(bucket):
    with pytest.raises(FileNotFoundError, match=rf"{bucket}/nothing: no run there"):
        load_run(f"{bucket}/nothing")


def test_a_failing_network_keeps_every_file_local_and_a_reopen_uploads_them(bucket, monkeypatch):
    url = f"{bucket}/runs/offline"
    monkeypatch.setenv(faults.ENV, "upload:raise")  # every upload fails, as with the network down
    with pytest.warns(RuntimeWarning, match=r"files of s3://.* were not uploaded .* they stay in .*staging"):
        record(url, range(3), output=Output(upload_wait=1.0))
    assert keys(url) == []  # nothing reached the bucket (the claim was taken and released)
    staging = Recorder(url).run_dir
    status = json.loads((staging / "ranks" / "rank000.json").read_text())
    # counted before the status itself was written: meta.json and the 4 tables' files, merged at close
    assert status["upload"]["files_not_uploaded"] == 5
    assert len(list(staging.glob("*/rank000/s*.parquet"))) == 4
    assert step_counts(load_run(staging))["steps"] == [0, 1, 2]  # the local copy holds every step
    monkeypatch.delenv(faults.ENV)
    faults.reset()
    record(url, range(3, 4))
    assert step_counts(load_run(url)) == {"steps": [0, 1, 2, 3], "tokens": [8, 8, 8, 8]}


def test_a_run_resumes_from_the_bucket_on_another_machine(bucket, tmp_path, monkeypatch):
    url = f"{bucket}/runs/moved"
    record(url, range(3))
    monkeypatch.setenv("TOKENGRAD_CACHE", str(tmp_path / "other-machine"))  # an empty staging folder
    record(url, range(3, 5))
    assert step_counts(load_run(url))["steps"] == [0, 1, 2, 3, 4]


def test_one_claim_wins_the_race_on_the_bucket(bucket):
    url = parse_url(f"{bucket}/runs/race")
    won, refused = [], []
    start = threading.Barrier(6)

    def claim():
        start.wait()
        try:
            won.append(bucket_claim.take(url, 0, fs=None))
        except RunClaimedError as err:
            refused.append(str(err))

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 5
    assert all("is held by pid" in r and "ranks/rank000.lock" in r for r in refused)
    won[0].release()
    bucket_claim.take(url, 0, fs=None).release()  # free again once released


@pytest.mark.slow  # a two-step run of the tiny model: ~8 s on 2 CPU cores
def test_the_built_in_trainer_records_into_a_bucket(bucket, tmp_path):
    from test_trainer import check_run, tiny

    from tokengrad.train.trainer import train

    url = f"{bucket}/runs/trained"
    staging = train(tiny(tmp_path, run_dir=url))
    assert staging == Recorder(url).run_dir and (staging / "checkpoint").is_dir()  # checkpoints stay local
    run = load_run(url)
    assert run.steps["step"].tolist() == [0, 1]
    for table in ("tokens", "layers", "samples"):  # each table is copied from the bucket when first read
        assert run.sql(f"SELECT count(*) AS n FROM {table}")["n"].iloc[0] > 0
    check_run(run.path, steps=2)
    assert "checkpoint" not in {k.split("/")[0] for k in keys(url)}
    assert not list(tmp_path.glob("s3*"))


def test_inspect_and_the_doctor_say_how_many_files_were_not_uploaded(bucket, monkeypatch, capsys):
    from tokengrad.cli import main
    from tokengrad.doctor.engine import diagnose

    url = f"{bucket}/runs/behind"
    monkeypatch.setenv(faults.ENV, "upload:raise")
    with pytest.warns(RuntimeWarning, match="were not uploaded"):
        record(url, range(2), output=Output(upload_wait=0.5))
    staging = Recorder(url).run_dir
    assert main(["inspect", str(staging)]) == 0
    out = capsys.readouterr().out
    assert f"upload     rank 0: 5 files not uploaded to {url} (they stay in {staging})" in out
    (found,) = [f for f in diagnose(staging) if f.id == "files_not_uploaded"]
    assert found.message == f"5 files not uploaded to {url} (rank 0: 5 in {staging})"
    monkeypatch.delenv(faults.ENV)
    record(url, range(2, 3))  # the re-open uploads them: the bucket's copy is whole and says so
    assert main(["inspect", url]) == 0
    out = capsys.readouterr().out
    assert f"bucket     {url}" in out and "not uploaded" not in out and "steps      3 (last 2)" in out
    assert [f.id for f in diagnose(url) if f.id == "files_not_uploaded"] == []


KILLED_CHILD = """
import time, sys
from test_reliability import record_step
from tokengrad.record.recorder import Recorder
from tokengrad.record.options import RunInfo
with Recorder(sys.argv[1], config={"lr": 1.0}, info=RunInfo(name="r")) as rec:
    for step in range(8):
        record_step(rec, step)
        time.sleep(0.2)
"""


@pytest.mark.subprocess
def test_a_kill_mid_upload_loses_nothing_committed_and_a_resume_finishes_the_upload(bucket, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    url = f"{bucket}/runs/killed"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, faults.ENV: "upload:kill@6", "PYTHONPATH": os.environ["PYTHONPATH"]}
    child = subprocess.run([sys.executable, "-c", KILLED_CHILD, url], cwd=repo, env=env, timeout=120)
    assert child.returncode == -9  # SIGKILL while copying its 6th file to the bucket
    staging = Recorder(url).run_dir
    committed = step_counts(load_run(staging))
    assert committed["steps"] and committed["tokens"] == [8] * len(committed["steps"])
    behind = [k for k in keys(url) if k.endswith(".parquet")]
    assert len(behind) == 5 - ("meta.json" in keys(url))  # the 6th upload never happened
    with pytest.warns(RuntimeWarning, match="broke the stale claim"):  # the killed process's claims
        Recorder(url, config={"lr": 1.0}, info=RunInfo(name="r")).open().close()
    assert step_counts(load_run(url)) == committed  # every committed step reached the bucket


def test_the_commands_read_a_run_in_a_bucket_and_name_a_bad_url_in_one_line(bucket, capsys):
    from tokengrad.cli import main

    url = f"{bucket}/runs/cli"
    record(url, range(3))
    assert main(["doctor", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)  # the findings (or none) as JSON, read from the bucket
    assert main(["watch", url, "--interval", "0.1"]) == 0  # finished: one pass, exit 0
    capsys.readouterr()
    missing = "s3://no-such-bucket-cli/runs/x"
    for command in ("inspect", "doctor", "watch"):
        assert main([command, missing]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"tokengrad {command}: error: {missing}: the bucket 'no-such-bucket-cli' does not exist"
