"""The gradient half under sharded and replicated wrappers, under torchrun (gloo on CPU, 2 and 4 processes):
bucket grad_norm / update_share / cos_to_total, per-block norms and the step grad_norm equal one process
on the whole batch (scripts/sharded_example.py), FSDP1's bucket analysis is refused in one line, and a rank
that leaves or dies before the bucket passes stops every rank within seconds instead of a hang."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tokengrad import load_run, schema

pytestmark = pytest.mark.torchrun

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "scripts" / "sharded_example.py"


def launch(nproc: int, script: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """torchrun with `nproc` processes (or plain python for 0); the completed process, failed or not."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    head = [sys.executable] + (
        ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] if nproc else []
    )
    return subprocess.run(
        [*head, str(script), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"{proc.args} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process on the whole global batch, each micro-batch setting of the tests."""
    out = {}
    for micro in ("1", "2"):
        run_dir = tmp_path_factory.mktemp("single") / f"micro{micro}"
        ok(launch(0, EXAMPLE, "--run-dir", str(run_dir), "--micro", micro))
        out[micro] = load_run(run_dir)
    return out


def bucket_frame(run, rank: int = 0):
    b = run.buckets[run.buckets["rank"] == rank] if "rank" in run.buckets else run.buckets
    return b.assign(lo=b.lo.fillna(-1.0)).set_index(["step", "update_id", "lo"]).sort_index()


def assert_matches(run, ref, world: int, rtol: float, resid_atol: float = 1e-5) -> None:
    """Every rank's figures equal the one-process figures of the same global batch; the residual row is
    zero to `resid_atol` (the rounding of the passes against g's own backward)."""
    want = bucket_frame(ref)
    inner = want.index.get_level_values("lo") >= 0
    assert inner.sum() == 8 and (want[inner].n_tokens > 0).all()  # 2 steps x 4 populated buckets
    for rank in range(world):
        got = bucket_frame(run, rank)
        assert got.index.equals(want.index)
        np.testing.assert_array_equal(got.n_tokens[inner], want.n_tokens[inner])  # summed over ranks
        for col in ("grad_norm", "update_share", "cos_to_total"):
            np.testing.assert_allclose(got[col][inner], want[col][inner], rtol=rtol, err_msg=col)
        # the loss is built on log pi only: the residual is the rounding of the passes against g's backward
        resid = got[~inner]
        assert (resid.grad_norm.abs() < resid_atol).all() and (resid.update_share.abs() < resid_atol).all()
        layers = run.layers[run.layers["rank"] == rank].set_index(["step", "layer"]).grad_norm
        ref_layers = ref.layers.set_index(["step", "layer"]).grad_norm
        assert sorted(layers.index) == sorted(ref_layers.index)
        np.testing.assert_allclose(layers.sort_index(), ref_layers.sort_index(), rtol=rtol)
        steps = run.steps[run.steps["rank"] == rank].set_index("step").grad_norm
        np.testing.assert_allclose(steps, ref.steps.set_index("step").grad_norm, rtol=rtol)


@pytest.mark.parametrize(
    "wrap, world, micro",
    [("fsdp2", 2, "1"), ("fsdp2", 4, "2"), ("ddp", 2, "1"), ("ddp", 4, "2")],
)
def test_bucket_figures_equal_one_process(tmp_path, single, wrap, world, micro):
    run_dir = tmp_path / wrap
    ok(launch(world, EXAMPLE, "--run-dir", str(run_dir), "--wrap", wrap, "--micro", micro))
    run = load_run(run_dir)
    assert run.meta["world_size"] == world
    assert_matches(run, single[micro], world, rtol=1e-4)


def test_fsdp2_mixed_precision_reduces_in_fp32(tmp_path, single):
    """bf16 forward and backward, fp32 reduction: the bucket passes reduce as g does, so the figures are
    the fp32 ones to bf16's rounding (|g| is about 0.6; the residual, bf16 rounding of the passes against
    g's own backward, about 0.003)."""
    run_dir = tmp_path / "mixed"
    ok(launch(2, EXAMPLE, "--run-dir", str(run_dir), "--wrap", "fsdp2_mixed"))
    run = load_run(run_dir)
    assert_matches(run, single["1"], 2, rtol=2e-2, resid_atol=1e-2)
    assert (run.buckets[run.buckets.bucket == schema.RESIDUAL_BUCKET].grad_norm > 1e-4).all()  # bf16


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_attribution_equals_one_process(tmp_path, world):
    """Per-token update_share and dlogprob_pred under FSDP2 (central differences at perturbed shards)
    against one process on the whole batch with exact forward-mode AD. Measured on 2 processes: 8.4e-5
    (update_share) and 1.5e-4 (dlogprob_pred) of the largest |value|, the central difference's error
    (record/attribution/shares.py: 1e-4 at the default eps); dlogprob, a plain forward, to 4e-5."""
    ok(launch(0, EXAMPLE, "--run-dir", str(tmp_path / "single"), "--attribution", "1"))
    ok(launch(world, EXAMPLE, "--run-dir", str(tmp_path / "fsdp2"), "--wrap", "fsdp2", "--attribution", "1"))
    key, cols = ["step", "sample_id", "position"], ["update_share", "dlogprob_pred", "dlogprob"]
    got = load_run(tmp_path / "fsdp2").tokens(columns=key + cols).set_index(key).sort_index()
    want = load_run(tmp_path / "single").tokens(columns=key + cols).set_index(key).sort_index()
    assert got.index.equals(want.index) and len(got) > 100
    for col, tol in (("update_share", 1.5e-4), ("dlogprob_pred", 4e-4), ("dlogprob", 1e-4)):
        err = np.abs(got[col] - want[col]).max() / np.abs(want[col]).max()
        assert err < tol, (col, err)
    # the shares of all ranks' tokens make the whole update: 1 per step, as in one process
    np.testing.assert_allclose(got.groupby("step").update_share.sum(), 1.0, atol=1e-3)


@pytest.mark.parametrize("wrap", ["fsdp1", "fsdp1_flat"])
def test_fsdp1_bucket_analysis_is_refused_in_one_line_and_norms_stay_exact(tmp_path, single, wrap):
    t0 = time.monotonic()
    proc = launch(2, EXAMPLE, "--run-dir", str(tmp_path / "refused"), "--wrap", wrap)
    assert proc.returncode != 0 and time.monotonic() - t0 < 120
    assert "ValueError: tokengrad: bucket analysis is refused under FSDP1" in proc.stderr
    assert "torch/distributed/fsdp" not in proc.stderr.split("ValueError")[0].split("Traceback")[-1]
    assert not (tmp_path / "refused").exists()  # refused before anything is written
    run_dir = tmp_path / "norms"
    ok(launch(2, EXAMPLE, "--run-dir", str(run_dir), "--wrap", wrap, "--buckets", "0"))
    run, ref = load_run(run_dir), single["1"]
    for rank in range(2):
        steps = run.steps[run.steps["rank"] == rank].set_index("step").grad_norm
        np.testing.assert_allclose(steps, ref.steps.set_index("step").grad_norm, rtol=1e-4)
    got = run.layers[run.layers["rank"] == 0].set_index(["step", "layer"]).grad_norm
    want = ref.layers.set_index(["step", "layer"]).grad_norm
    if wrap == "fsdp1":  # original parameters keep their names, so every block has its row
        np.testing.assert_allclose(got.sort_index(), want.loc[got.sort_index().index], rtol=1e-4)


# rank 1 leaves the step between its backward and record_grad_norms: by an error it catches (LEAVE), or
# by dying (DIE); rank 0 must stop with the one-line error, not wait in the bucket passes' reduce-scatters
FAULT = """
import os, sys, time
sys.path.insert(0, {scripts!r})
import sharded_example as ex
from tokengrad.record.buckets.agreement import RankAgreementError

mode, out = sys.argv[1], sys.argv[2]
step_of = ex.train_step

def train_step(st, model, opt, batch, micro):
    if int(os.environ["RANK"]) == 1 and st.step == 1:
        st.clip_grad_norm_ = leave  # called after the backward, where record_grad_norms would be
    return step_of(st, model, opt, batch, micro)

def leave(max_norm):
    if mode == "die":
        os._exit(0)
    raise KeyError("rank 1 leaves")

ex.train_step = train_step
t0 = time.monotonic()
try:
    ex.main(out, "fsdp2", steps=2, buckets=1)
except RankAgreementError as err:
    open(f"{{out}}.rank{{os.environ['RANK']}}.txt", "w").write(f"{{time.monotonic() - t0:.1f}}\\n{{err}}")
except KeyError as err:  # rank 1's own error
    open(f"{{out}}.rank{{os.environ['RANK']}}.txt", "w").write(f"own\\n{{err}}")
os._exit(0)
"""


@pytest.mark.parametrize("mode", ["leave", "die"])
def test_a_rank_that_leaves_or_dies_stops_every_rank_in_one_line(tmp_path, mode):
    script = tmp_path / "fault.py"
    script.write_text(FAULT.format(scripts=str(ROOT / "scripts")))
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = launch(2, script, mode, str(out), timeout=240)
    assert time.monotonic() - t0 < 200, "a rank waited for the one that left"
    ok(proc)
    seconds, line = (tmp_path / "run.rank0.txt").read_text().split("\n", 1)
    assert "\n" not in line and line.startswith("tokengrad: step 1: bucket analysis")
    if mode == "leave":
        assert "rank 1 left the step with an error" in line
        assert (tmp_path / "run.rank1.txt").read_text().startswith("own")
    else:
        assert "not every rank arrived" in line
    run = load_run(out)  # step 0 and what step 1 recorded before the stop are kept
    assert sorted(run.steps[run.steps["rank"] == 0].step) == [0, 1]
    assert sorted(run.buckets[run.buckets["rank"] == 0].step.unique()) == [0]
