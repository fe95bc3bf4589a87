"""Runs under torchrun (2 processes, gloo on CPU): every rank writes its own files, the reader merges them,
per-step gradient norms are the global ones (equal to one process on the whole batch), nothing is written
twice."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tokengrad import load_run

pytestmark = pytest.mark.torchrun  # every test here launches processes; scripts/test.sh runs them second

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2


def torchrun(script: str | Path, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(WORLD),
        str(ROOT / "scripts" / script),
        *args,
    ]  # an absolute `script` path stays as it is
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), ROOT / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a script's dataclasses look their module up there
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
    load_script("ddp_example.py").main(str(tmp_path / "single"), steps=2)  # same global batch, one process
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
    torchrun("trl_example.py", "--run-dir", str(tmp_path / "trl"), "--steps", "2", "--logging-steps", "1")
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
    assert (
        per_sample.tolist() == samples.set_index(["step", "sample_id"]).length.loc[per_sample.index].tolist()
    )


FSDP_SCRIPT = """
import json, os, sys, torch
from torch.distributed.fsdp import fully_shard
from tokengrad.train import distributed as dist
from tokengrad.record.gradnorms import grad_norms, trainable_params
from tokengrad.train.models import make_tiny_model

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
with open(f"{sys.argv[1]}.rank{dist.rank()}.json", "w") as f:
    json.dump(out, f)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
# FSDP's background threads can abort the interpreter's teardown ("terminate called without an active
# exception"); the results are on disk, so leave without it
os._exit(0)
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
        assert out["local_total"] < 0.99 * ref_total  # one shard alone is not the gradient


# ---- the built-in trainer under torchrun ---------------------------------------------------------------
RAGGED_TASK = '''
from tokengrad.train.tasks import TASKS, Problem, register_task


class RaggedTask:
    """Completions end at the first two U+FFFD in a row (a lone byte >= 0x80 decodes to one; about half of
    the tiny model's tokens are such bytes), so their lengths, and the ranks' token counts, differ. Reward:
    the share of ASCII letters, except problems 6 and 7 (rank 1's at step 1), whose flat rewards make
    dynamic sampling drop all of that rank's groups."""

    name = "ragged"
    tool_stop = "\\ufffd\\ufffd"

    def train_problems(self, n, seed):
        return [Problem(f"Spell a word, round {seed}-{i}.", "", str(1 + i % 2), meta={"flat": i in (6, 7)})
                for i in range(n)]

    def eval_problems(self, n_per_difficulty, seed):
        return self.train_problems(2 * n_per_difficulty, seed + 1000)

    def reward(self, problem, completion):
        if problem.meta["flat"]:
            return 0.5
        return sum(c.isascii() and c.isalpha() for c in completion) / max(len(completion), 1)

    def is_correct(self, problem, completion):
        return self.reward(problem, completion) > 0.5

    def tool(self, text):
        return None          # no tool: the completion ends at the stop string


if "ragged" not in TASKS:
    register_task("ragged")(RaggedTask)
'''

# `tokengrad train` through the CLI entry point; keeps what each rank sampled at each step, so that one
# process can replay the same global batch.
TRAIN_SCRIPT = (
    RAGGED_TASK
    + """
import dataclasses, json, os, sys
import tokengrad.train.trainer
from tokengrad.cli import main

sampled, generate = [], tokengrad.train.trainer.generate_completions

def keep(*args, **kwargs):
    comps = generate(*args, **kwargs)
    sampled.append(dataclasses.asdict(comps))
    return comps

tokengrad.train.trainer.generate_completions = keep
code = main(["train", *sys.argv[2:]])
json.dump(sampled, open(f"{sys.argv[1]}.rank{os.environ['RANK']}.json", "w"))
sys.exit(code)
"""
)

DDP_CONFIG = """
model = "tiny"
task = "ragged"
steps = 2
prompts_per_step = 4
group_size = 2
max_new_tokens = 8
max_turns = 1
lr = 0.01
aggregation = "dapo"
weighting = "lopti"
weighting_params = { eta = 0.004 }
grad_accum = 2
dynamic_sampling = true
progress = false
"""


def replay(sampled: list[list[dict]]):
    """A generate_completions stand-in returning, call by call (step by step), the ranks' samples joined in
    rank order: the global batch of that step."""
    from tokengrad.train.generation import Completions, encode_prompt

    steps = iter(zip(*sampled))

    def generate(model, tok, prompts, n_samples, **kwargs):
        parts = next(steps)
        comps = Completions(**{f: [x for part in parts for x in part[f]] for f in parts[0]})
        assert comps.prompt_ids == [encode_prompt(tok, p) for p in prompts for _ in range(n_samples)]
        return comps

    return generate


def test_builtin_trainer_under_torchrun_equals_one_process_on_the_global_batch(tmp_path, monkeypatch):
    import tokengrad.train.trainer
    from tokengrad import schema
    from tokengrad.train.config import read_config_file

    script, config = tmp_path / "train_ddp.py", tmp_path / "ddp.toml"
    script.write_text(TRAIN_SCRIPT)
    config.write_text(DDP_CONFIG)
    proc = torchrun(
        script,
        str(tmp_path / "sampled"),
        str(config),
        "--run-dir",
        str(tmp_path / "ddp"),
        "eval_every=2",
        "eval_per_difficulty=2",
        "bucket_every=1",
    )
    assert proc.stdout.split() == [str(tmp_path / "ddp")]  # the run directory, printed once
    run = load_run(tmp_path / "ddp")
    assert_rank_files_disjoint(run)
    assert (run.path / "checkpoint" / "trainer.pt").exists()

    # one process, same config, replaying the same global batch at every step
    exec(RAGGED_TASK, {})
    sampled = [json.loads((tmp_path / f"sampled.rank{r}.json").read_text()) for r in range(WORLD)]
    monkeypatch.setattr(tokengrad.train.trainer, "generate_completions", replay(sampled))
    single = load_run(
        tokengrad.train.trainer.train(
            {
                **read_config_file(config),
                "run_dir": str(tmp_path / "single"),
                "checkpoint": False,
                "eval_every": 2,
                "eval_per_difficulty": 2,
            }
        )
    )

    tokens = run.tokens(columns=["step", "rank", "update_id", "pass_id", "sample_id", "position"])
    assert not tokens.duplicated(["step", "rank", "sample_id", "position", "pass_id"]).any()
    assert not tokens.duplicated(["step", "sample_id", "position", "pass_id"]).any()  # ids unique over ranks
    samples = run.samples  # rank r holds prompts 2r, 2r + 1 of each step: samples 4r .. 4r + 3
    assert (samples.sample_id // 4 == samples["rank"]).all() and (
        samples.group_id == samples.sample_id // 2
    ).all()
    # what the loss weights must get right: at step 0 the ranks train on different numbers of tokens
    # (token-mean loss); at step 1 dynamic sampling drops all of rank 1's groups and rank 0 trains alone
    n_tok = tokens[tokens.update_id == 0].groupby(["step", "rank"]).size()  # every token once per update
    assert n_tok[(0, 0)] != n_tok[(0, 1)] and (1, 1) not in n_tok.index and n_tok[(1, 0)] > 0
    assert samples[(samples.step == 1) & (samples["rank"] == 1)].in_update.eq(0).all()

    # per-step scalars: identical on both ranks and equal to one process on the global batch
    steps, ref = run.steps.set_index(["step", "rank"]), single.steps.set_index("step")
    for col in ["grad_norm", "loss", "reward_mean", "reward_std", "accuracy", "completion_len", "n_updates"]:
        per_rank = steps[col].unstack("rank")
        np.testing.assert_array_equal(per_rank[0], per_rank[1], err_msg=col)
        np.testing.assert_allclose(per_rank[0], ref[col], rtol=1e-4, err_msg=col)
    assert steps.n_updates.tolist() == [2, 2, 2, 2]  # Lopti: two updates, every rank
    # the global norm of every update, on both ranks, equals the one process's
    layers = run.layers[run.layers.layer == schema.TOTAL_LAYER]
    total = layers.pivot_table(index=["step", "update_id"], columns="rank", values="grad_norm")
    want = single.layers[single.layers.layer == schema.TOTAL_LAYER].set_index(["step", "update_id"]).grad_norm
    assert len(total) == 4 and (total[0] == total[1]).all() and (want > 0).all()
    np.testing.assert_allclose(total[0], want.loc[total.index], rtol=1e-4)

    # bucket figures are all-reduced (identical on both ranks); skipped at step 1, where rank 1 had no tokens
    buckets = run.buckets.pivot_table(
        index=["step", "update_id", "bucket"], columns="rank", values="grad_norm"
    )
    assert buckets.index.get_level_values("step").unique().tolist() == [0]
    np.testing.assert_allclose(buckets[0], buckets[1], rtol=1e-6)
    # evaluation split over the ranks, written once, by rank 0: 2 problems per difficulty after the last step,
    # with the one process's accuracies
    evals = run.evals
    assert evals[["step", "rank", "difficulty", "n"]].values.tolist() == [[1, 0, "1", 2], [1, 0, "2", 2]]
    assert evals.accuracy.tolist() == single.evals.accuracy.tolist()
    assert not (run.path / "evals" / "rank001").exists()
