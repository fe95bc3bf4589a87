"""Runs under torchrun (2 processes, gloo on CPU): every rank writes its own files, the reader merges them,
per-step gradient norms are the global ones (equal to one process on the whole batch), nothing is written twice."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tokengrad import load_run

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2


def torchrun(script: str | Path, *args: str, timeout: int = 240) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD),
           str(ROOT / "scripts" / script), *args]                     # an absolute `script` path stays as it is
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), ROOT / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_rank_files_disjoint(run, tables=("tokens", "steps", "layers", "samples")):
    """Each rank writes only under its own rank folder, and only rows of its own rank."""
    for table in tables:
        folders = sorted(p.name for p in (run.path / table).iterdir())
        assert folders == [f"rank{r:03d}" for r in range(WORLD)], (table, folders)
        frame = run.table(table) if table != "tokens" else run.tokens(columns=["rank"])
        assert sorted(frame["rank"].unique()) == list(range(WORLD)), table
        for f in run.files(table):
            import pyarrow.parquet as pq
            ranks = set(pq.read_table(f, columns=["rank"]).column("rank").to_pylist())
            assert ranks == {int(Path(f).parent.name[4:])}, f
    status = run.rank_status
    assert [s["rank"] for s in status] == list(range(WORLD)) and all(s["finished"] for s in status)
    assert run.meta["world_size"] == WORLD


def test_ddp_loop_matches_one_process_on_the_concatenated_batch(tmp_path):
    torchrun("ddp_example.py", "--run-dir", str(tmp_path / "ddp"), "--steps", "2")
    load_script("ddp_example.py").main(str(tmp_path / "single"), steps=2)   # same global batch, one process
    ddp, single = load_run(tmp_path / "ddp"), load_run(tmp_path / "single")
    assert_rank_files_disjoint(ddp)

    # grad norms: identical on both ranks (read after DDP's all-reduce) and equal to the 1-process gradient
    steps = ddp.steps.pivot(index="step", columns="rank", values="grad_norm")
    assert (steps[0] == steps[1]).all()
    np.testing.assert_allclose(steps[0], single.steps.grad_norm, rtol=1e-5)
    layers = ddp.layers.pivot_table(index=["step", "layer"], columns="rank", values="grad_norm")
    ref = single.layers.set_index(["step", "layer"]).grad_norm
    np.testing.assert_allclose(layers[0], layers[1], rtol=0)
    np.testing.assert_allclose(layers[0], ref.loc[layers.index], rtol=1e-5)
    np.testing.assert_allclose(ddp.steps.global_tokens, np.repeat(single.steps.n_tokens, WORLD))

    # no duplicate rows: every (step, sample, position) once over both ranks, and the union is the whole batch
    key = ["step", "sample_id", "position"]
    a = ddp.tokens().set_index(key).sort_index()
    b = single.tokens().set_index(key).sort_index()
    assert a.index.is_unique and a.index.equals(b.index)
    assert ddp.samples.set_index(["step", "sample_id"]).index.is_unique
    assert len(ddp.samples) == len(single.samples)
    np.testing.assert_allclose(a.logprob, b.logprob, rtol=1e-5, atol=1e-6)
    # coef is dL_rank/dlog pi of the rank's own loss (a mean over its half of the sequences); DDP averages
    # the ranks' gradients, so the global coefficient is coef / world_size
    np.testing.assert_allclose(a.coef / WORLD, b.coef, rtol=1e-4, atol=1e-9)


@pytest.mark.slow
@pytest.mark.trl
def test_trl_under_torchrun_writes_per_rank_files_with_global_grad_norms(tmp_path):
    pytest.importorskip("trl")
    torchrun("trl_example.py", "--run-dir", str(tmp_path / "trl"), "--steps", "2")
    run = load_run(tmp_path / "trl")
    assert_rank_files_disjoint(run)
    steps = run.steps.pivot(index="step", columns="rank", values="grad_norm")
    assert (steps[0] == steps[1]).all()
    # TRL logs the norm returned by accelerator.clip_grad_norm_ (global after DDP's all-reduce)
    np.testing.assert_allclose(run.steps.grad_norm, run.steps.trl_grad_norm, rtol=1e-5)
    samples = run.samples
    assert samples.set_index(["step", "sample_id"]).index.is_unique
    # TRL's process slice: rank r holds completions r*4 .. r*4+3 of the generation batch, one group each
    assert sorted(samples[samples["rank"] == 1].sample_id.unique()) == [4, 5, 6, 7]
    assert (samples.group_id == samples.sample_id // 4).all()
    tokens = run.tokens(columns=["step", "rank", "sample_id", "position"])
    assert tokens.set_index(["step", "sample_id", "position"]).index.is_unique
    per_sample = tokens.groupby(["step", "sample_id"]).size()
    assert per_sample.tolist() == samples.set_index(["step", "sample_id"]).length.loc[per_sample.index].tolist()


FSDP_SCRIPT = """
import json, sys, torch
from torch.distributed.fsdp import fully_shard
from tokengrad import distributed as dist
from tokengrad.gradnorms import grad_norms, trainable_params
from tokengrad.models import make_tiny_model

def loss_of(model, ids):
    return model(ids).logits.float().logsumexp(-1).mean()

torch.distributed.init_process_group("gloo")
ids = torch.randint(0, 256, (4, 12), generator=torch.Generator().manual_seed(0))   # same batch on every rank
ref = make_tiny_model(seed=0)
loss_of(ref, ids).backward()
model = make_tiny_model(seed=0)
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)
loss_of(model, ids).backward()              # FSDP averages over ranks: the full gradient equals the reference
out = {"sharded": dist.grads_are_sharded(model), "ref": grad_norms(trainable_params(ref)),
       "global": dist.global_grad_norms(model)}
out["local_total"] = sum(float(p.grad.to_local().pow(2).sum()) for p in model.parameters()) ** 0.5
json.dump(out, open(f"{sys.argv[1]}.rank{dist.rank()}.json", "w"))
torch.distributed.destroy_process_group()
"""


@pytest.mark.slow
def test_global_grad_norms_sum_fsdp_shards(tmp_path):
    script = tmp_path / "fsdp_norms.py"
    script.write_text(FSDP_SCRIPT)
    torchrun(script, str(tmp_path / "out"))
    for r in range(WORLD):
        out = json.loads((tmp_path / f"out.rank{r}.json").read_text())
        assert out["sharded"] is True
        ref_total, ref_blocks = out["ref"]
        total, blocks = out["global"]
        assert total == pytest.approx(ref_total, rel=1e-5)
        assert blocks.keys() == ref_blocks.keys()
        for b in ref_blocks:
            assert blocks[b] == pytest.approx(ref_blocks[b], rel=1e-5), b
        assert out["local_total"] < 0.99 * ref_total            # one shard alone is not the gradient


def test_distributed_helpers_in_one_process(monkeypatch, tiny_model, batch):
    from tokengrad import distributed as dist
    from tokengrad.gradnorms import grad_norms, trainable_params

    assert (dist.rank(), dist.world_size(), dist.is_main()) == (0, 1, True)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")               # set by torchrun before the process group exists
    assert (dist.rank(), dist.world_size(), dist.is_main()) == (3, 4, False)
    assert dist.all_reduce([1.5, 2.0]).tolist() == [1.5, 2.0]    # no process group: the values themselves
    with pytest.raises(ValueError, match="unknown reduce op 'mean'"):
        dist.all_reduce([1.0], op="mean")
    ids, _, _ = batch
    tiny_model(ids).logits.float().logsumexp(-1).mean().backward()
    assert not dist.grads_are_sharded(tiny_model)
    total, blocks = dist.global_grad_norms(tiny_model)
    ref_total, ref_blocks = grad_norms(trainable_params(tiny_model))
    assert total == pytest.approx(ref_total, rel=1e-6) and blocks == pytest.approx(ref_blocks, rel=1e-6)
    _, only = dist.global_grad_norms(tiny_model, names=lambda b: b.startswith("model.layers"))
    assert sorted(only) == ["model.layers.0", "model.layers.1"]
