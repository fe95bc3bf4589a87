"""Tracker scalars: the pure table -> (tag, step, value) mapping, `tokengrad publish` and
Recorder(trackers=...), read back with TensorBoard's own EventAccumulator (and W&B's offline run files)."""

from __future__ import annotations

import time

import pandas as pd
import pytest
import torch
from conftest import forward_logprobs

from tokengrad import Recorder, load_run
from tokengrad.cli import main
from tokengrad.integrations.trackers.scalars import Scalar, table_scalars
from tokengrad.record import Buckets, Output

tb_reader = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

EDGES = (0.0, 0.0155, 1.0)  # the tiny model's probabilities sit around 1/64: half the tokens in each bucket
ADVS = {0: [1.0, -0.5, 0.25, -1.5], 1: [0.0, 0.0, 0.0, 0.0], 2: [0.5, -0.5, 1.0, -1.0]}  # step 1 is dead


def _record(run_dir, model, ids, mask, trackers=()):
    with Recorder(
        run_dir, model=model, buckets=Buckets(every=2, edges=EDGES), output=Output(trackers=trackers)
    ) as rec:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, adv in ADVS.items():
            adv = torch.tensor(adv)
            with rec.step(step) as st:
                logits, lp, _, tgt = forward_logprobs(model, ids)
                st.track(lp, token_ids=tgt, mask=mask, advantages=adv, logits=logits)
                loss = -((lp * adv[:, None] * mask).sum(1) / mask.sum(1)).mean()
                st.backward(loss)
                st.record_grad_norms()
                opt.step()
                opt.zero_grad()
                st.log(loss=loss.item(), lr=0.1)
            rec.log_eval(step, "kk", 3, accuracy=0.25 * step, n=8)
    return load_run(run_dir)


def _read_tb(logdir) -> dict[str, dict[int, float]]:
    acc = tb_reader.EventAccumulator(str(logdir), size_guidance={tb_reader.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


@pytest.fixture
def recorded(tmp_path, tiny_model, batch):
    ids, mask, _ = batch
    from tokengrad.integrations.trackers import TensorBoardTracker

    live = TensorBoardTracker(tmp_path / "tb_live")
    run = _record(tmp_path / "run", tiny_model, ids, mask, trackers=[live])
    return run, tmp_path


def test_publish_writes_the_run_tables_to_tensorboard(recorded, capsys):
    run, tmp = recorded
    assert main(["publish", str(run.path), "--tensorboard", str(tmp / "tb")]) == 0
    assert "published" in capsys.readouterr().out
    got = _read_tb(tmp / "tb")
    steps, layers, buckets = run.steps, run.table("layers"), run.table("buckets")
    # step scalars and per-block norms equal the tables (float32 in the event file)
    for _, row in steps.iterrows():
        s = int(row["step"])
        assert got["tokengrad/grad_norm"][s] == pytest.approx(row["grad_norm"], rel=1e-6)
        assert got["tokengrad/loss"][s] == pytest.approx(row["loss"], rel=1e-6, abs=1e-7)
        assert got["tokengrad/n_tokens"][s] == row["n_tokens"]
    for _, row in layers.iterrows():
        tag = f"tokengrad/layer/{row['layer']}/grad_norm"
        assert got[tag][int(row["step"])] == pytest.approx(row["grad_norm"], rel=1e-6, abs=1e-9)
    assert {"tokengrad/layer/model.layers.1/grad_norm", "tokengrad/layer/total/grad_norm"} <= got.keys()
    # buckets only on bucket steps 0 and 2; shares sum to 1 with the residual
    b2 = buckets[buckets["step"] == 2]
    for _, row in b2[b2["bucket"] != "residual"].iterrows():
        name = f"{row['lo']:.2f}-{row['hi']:.2f}"
        assert got[f"tokengrad/bucket/{name}/token_share"][2] == pytest.approx(row["token_share"], rel=1e-6)
        assert got[f"tokengrad/bucket/{name}/update_share"][2] == pytest.approx(row["update_share"], abs=1e-6)
    shares = [v[2] for k, v in got.items() if k.endswith("/update_share")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-5)
    assert set(got["tokengrad/bucket/0.00-0.02/token_share"]) == {0, 2}
    assert 0.2 < got["tokengrad/bucket/0.00-0.02/token_share"][2] < 0.8
    # dead-step flags: step 1 had only zero advantages (and so a zero gradient)
    assert got["tokengrad/dead_step"] == {0: 0.0, 1: 1.0, 2: 0.0}
    assert got["tokengrad/grad_norm"][1] == 0.0
    assert got["tokengrad/eval/kk/3/accuracy"] == {0: 0.0, 1: 0.25, 2: 0.5}


def test_live_trackers_match_publish(recorded):
    run, tmp = recorded
    main(["publish", str(run.path), "--tensorboard", str(tmp / "tb")])
    live, published = _read_tb(tmp / "tb_live"), _read_tb(tmp / "tb")
    assert live.keys() == published.keys()
    for tag in published:
        assert live[tag] == pytest.approx(published[tag]), tag


def test_table_scalars_by_hand():
    steps = pd.DataFrame(
        {
            "step": [0, 0, 1],
            "rank": [0, 1, 0],
            "loss": [1.0, 3.0, 5.0],
            "n_tokens": [10, 20, 7],
            "flag": [True, False, True],
        }
    )
    layers = pd.DataFrame(
        {
            "step": [0, 0],
            "rank": [0, 0],
            "update_id": [0, 1],
            "layer": ["model.layers.0", "model.layers.0"],
            "grad_norm": [2.0, 3.0],
        }
    )
    buckets = pd.DataFrame(
        {
            "step": [0, 0, 0, 0],
            "rank": [0] * 4,
            "update_id": [0, 1, 0, 1],
            "bucket": ["[0.00,0.50)", "[0.00,0.50)", "residual", "residual"],
            "lo": [0.0, 0.0, None, None],
            "hi": [0.5, 0.5, None, None],
            "update_share": [0.2, 0.4, 0.8, 0.6],
            "grad_norm": [1.0, 2.0, 3.0, 1.0],
        }
    )
    evals = pd.DataFrame(
        {
            "step": [1, 1],
            "rank": [0, 1],
            "task": ["kk", "kk"],
            "difficulty": ["3", "3"],
            "accuracy": [0.5, 1.0],
            "n": [2, 6],
        }
    )
    tokens = pd.DataFrame(
        {"step": [0, 0, 1, 1], "in_loss": [True, True, True, False], "advantage": [0.0, 1.0, 0.0, 2.0]}
    )
    got = table_scalars(dict(steps=steps, layers=layers, buckets=buckets, evals=evals, tokens=tokens))
    want = [
        Scalar("tokengrad/loss", 0, 2.0),
        Scalar("tokengrad/loss", 1, 5.0),  # mean over ranks
        Scalar("tokengrad/n_tokens", 0, 30.0),
        Scalar("tokengrad/n_tokens", 1, 7.0),  # counts: sum
        Scalar("tokengrad/layer/model.layers.0/grad_norm", 0, 3.0),  # max over updates
        Scalar("tokengrad/bucket/0.00-0.50/update_share", 0, pytest.approx(0.3)),  # mean over updates
        Scalar("tokengrad/bucket/0.00-0.50/grad_norm", 0, 2.0),
        Scalar("tokengrad/bucket/residual/update_share", 0, pytest.approx(0.7)),
        Scalar("tokengrad/bucket/residual/grad_norm", 0, 3.0),
        Scalar("tokengrad/eval/kk/3/accuracy", 1, 0.875),  # (0.5*2 + 1*6) / 8
        Scalar("tokengrad/dead_step", 0, 0.0),
        Scalar("tokengrad/dead_step", 1, 1.0),  # the advantage 2.0 is not in the loss
    ]
    assert sorted(got, key=lambda s: (s.tag, s.step)) == sorted(want, key=lambda s: (s.tag, s.step))
    assert [s.step for s in got] == sorted(s.step for s in got)  # step order for the trackers


def test_publish_needs_a_target(recorded, capsys):
    run, _ = recorded
    with pytest.raises(SystemExit):
        main(["publish", str(run.path)])
    assert "--tensorboard" in capsys.readouterr().err


def test_unknown_tracker_lists_known():
    from tokengrad.integrations.trackers import make_tracker

    with pytest.raises(ValueError, match="tensorboard.*wandb"):
        make_tracker("mlflow", "x")


def _wandb_records(path) -> list:
    """The protobuf records of a W&B run file. wandb 0.31 ships no Python reader (its Go core syncs the file),
    so this follows the framing it uses: a 7-byte ':W&B' header, then LevelDB log blocks of 32 KiB whose
    chunks carry a 7-byte header (crc32, little-endian length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, block, out, parts = open(path, "rb").read(), 32768, [], b""
    assert data[:4] == b":W&B"
    pos = 7
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(parts)
            out.append(rec)
            parts = b""
    return out


def test_publish_to_wandb_offline(recorded, monkeypatch):
    pytest.importorskip("wandb")
    run, tmp = recorded
    monkeypatch.setenv("WANDB_SILENT", "true")
    argv = ["--wandb", "tokengrad-test", "--wandb-mode", "offline", "--wandb-dir", str(tmp)]
    assert main(["publish", str(run.path), *argv]) == 0
    (path,) = list((tmp / "wandb").glob("offline-run-*/run-*.wandb"))
    records = _wandb_records(path)
    for _ in range(100):  # W&B's core process may still be writing the file when finish() returns
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        time.sleep(0.2)
        records = _wandb_records(path)
    logged = {}
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item}
            logged[int(float(items["step"]))] = items
    steps = run.steps.set_index("step")
    assert sorted(logged) == [0, 1, 2]
    for s, items in logged.items():
        assert float(items["tokengrad/grad_norm"]) == pytest.approx(steps.loc[s, "grad_norm"], rel=1e-9)
        assert float(items["tokengrad/eval/kk/3/accuracy"]) == 0.25 * s
    assert [float(logged[s]["tokengrad/dead_step"]) for s in range(3)] == [0.0, 1.0, 0.0]


def test_publish_counts_and_names_the_nan_and_inf_values_it_leaves_out(tmp_path, capsys):
    from test_queries import _write, make_tiny_run

    from tokengrad.cli.publish import report_nonfinite
    from tokengrad.integrations.trackers.scalars import NonFinite, nonfinite_values

    run_dir = make_tiny_run(tmp_path / "bad", n_steps=8)
    for f in (run_dir / "steps").rglob("*.parquet"):
        f.unlink()
    nan, inf = float("nan"), float("inf")
    # loss NaN at steps 5-7; kl logged as NaN at step 2 and not logged (null) on odd steps; grad_norm -inf
    steps = [
        dict(step=s, rank=0, loss=nan if s >= 5 else 0.1, kl=nan if s == 2 else (None if s % 2 else 0.01))
        for s in range(8)
    ]
    steps[4]["grad_norm"] = -inf
    _write(run_dir, "steps", steps)
    layers = [
        dict(step=s, rank=0, update_id=0, layer="total", grad_norm=inf if s == 6 else 1.0) for s in (5, 6)
    ]
    _write(run_dir, "layers", layers, seq=9)
    run = load_run(run_dir)
    assert nonfinite_values(run) == [
        NonFinite(tag="tokengrad/grad_norm", nan=0, inf=1, first_step=4, last_step=4),
        NonFinite(
            tag="tokengrad/kl", nan=1, inf=0, first_step=2, last_step=2
        ),  # the null steps are not counted: nothing was recorded
        NonFinite(tag="tokengrad/layer/total/grad_norm", nan=0, inf=1, first_step=6, last_step=6),
        NonFinite(tag="tokengrad/loss", nan=3, inf=0, first_step=5, last_step=7),
    ]
    assert main(["publish", str(run_dir), "--tensorboard", str(tmp_path / "tb")]) == 0
    out, err = capsys.readouterr()
    assert "published" in out
    assert err.splitlines() == [
        "left out 6 NaN/inf value(s) of 4 metric(s), which trackers cannot plot:",
        "  tokengrad/grad_norm: 1 inf (step 4)",
        "  tokengrad/kl: 1 NaN (step 2)",
        "  tokengrad/layer/total/grad_norm: 1 inf (step 6)",
        "  tokengrad/loss: 3 NaN (steps 5-7)",
    ]
    got = _read_tb(tmp_path / "tb")
    assert sorted(got["tokengrad/loss"]) == [0, 1, 2, 3, 4]  # the finite points are all there
    assert (
        report_nonfinite(
            [NonFinite(tag="t", nan=1, inf=2, first_step=0, last_step=3)] * 3, shown=1
        ).splitlines()[-1]
        == "  ... and 2 more metric(s)"
    )
