"""Sharded gradients in one process (a gloo group of one rank, so FSDP2, FSDP1 and DTensor run on CPU): the
streamed bucket analysis equals the one on plain gradients, the refusals (FSDP1, tensor parallelism / HSDP)
are one line at open before anything is written, and an agreement with a rank that cannot take part
raises. The same under torchrun with 2 and 4 processes: tests/record/test_sharded.py."""

import socket

import pytest
import torch

from tokengrad import Recorder, load_run
from tokengrad.record.buckets.agreement import NO_PASS, READY, RankAgreement, RankAgreementError
from tokengrad.record.options import Buckets

EDGES = (0.0, 0.0036, 0.0039, 0.0042, 1.0)  # the tiny model's probabilities sit near 1/259


@pytest.fixture
def group(monkeypatch):
    """A one-rank gloo process group for the test, destroyed after it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def record(run_dir, model, ids, steps=2):
    """Two steps of a token-mean policy-gradient loss with bucket analysis, SGD in between."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0])  # [N]
    with Recorder(run_dir, model=model, buckets=Buckets(1, EDGES)) as rec:
        for step in range(steps):
            with rec.step(step) as st:
                logits = model(ids).logits[:, :-1]  # [N, T, V]
                lp = torch.log_softmax(logits.float(), -1).gather(2, ids[:, 1:, None]).squeeze(-1)  # [N, T]
                st.track(lp, token_ids=ids[:, 1:], advantages=adv)
                st.backward(-(lp * adv[:, None]).mean())
                st.clip_grad_norm_(1.0)
                opt.step()
                opt.zero_grad()
    return load_run(run_dir)


def test_streamed_shards_equal_plain_gradients(tmp_path, group):
    from torch.distributed.fsdp import fully_shard

    from tokengrad.train.models import make_tiny_model

    ids = torch.randint(0, 256, (4, 10), generator=torch.Generator().manual_seed(3))  # [N, T + 1]
    plain = record(tmp_path / "plain", make_tiny_model(seed=0), ids)
    model = make_tiny_model(seed=0)
    for layer in model.model.layers:
        fully_shard(layer)
    sharded = record(tmp_path / "fsdp2", fully_shard(model), ids)
    a = sharded.buckets.set_index(["step", "update_id", "lo"])
    b = plain.buckets.set_index(["step", "update_id", "lo"])
    assert len(a) == len(b) == 10 and (b.n_tokens.dropna() > 0).all()  # 2 steps x (4 buckets + residual)
    assert a.n_tokens.fillna(-1).tolist() == b.n_tokens.fillna(-1).tolist()
    inner = b.index.get_level_values("lo").notna()
    for col in ("grad_norm", "update_share", "cos_to_total"):
        torch.testing.assert_close(
            torch.tensor(a[col][inner].values), torch.tensor(b[col][inner].values), rtol=1e-5, atol=0
        )
    # the plain run derives one bucket as g minus the others (residual 0 exactly); the streamed residual
    # is g minus every pass's g_B: zero to float32 rounding
    assert (a.grad_norm[~inner].abs() < 1e-6).all()
    torch.testing.assert_close(
        torch.tensor(sharded.layers.grad_norm.values),
        torch.tensor(plain.layers.grad_norm.values),
        rtol=1e-5,
        atol=0,
    )


def test_fsdp1_bucket_analysis_is_refused_at_open(tmp_path, group):
    from torch.distributed.fsdp import FullyShardedDataParallel

    from tokengrad.train.models import make_tiny_model

    model = FullyShardedDataParallel(make_tiny_model(seed=0), device_id=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"^tokengrad: bucket analysis is refused under FSDP1 .*fully_shard"):
        Recorder(tmp_path / "run", model=model, buckets=1).open()
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=r"^tokengrad: attribution is refused under FSDP1 .*attribution=0"):
        Recorder(tmp_path / "run", model=model, attribution=1).open()
    assert not (tmp_path / "run").exists()


def test_entropy_attribution_is_refused_under_fsdp2(group):
    from torch.distributed.fsdp import fully_shard

    from tokengrad.record.attribution.step import StepAttribution
    from tokengrad.train.models import make_tiny_model

    model = fully_shard(make_tiny_model(seed=0))
    with pytest.raises(ValueError, match=r"^tokengrad: entropy attribution is refused under sharded"):
        StepAttribution(model, entropy=True)
    assert StepAttribution(model).method == "shard_difference"  # forward-mode AD cannot pass FSDP


def test_spike_replay_is_refused_under_fsdp2_at_open(tmp_path, group):
    from torch.distributed.fsdp import fully_shard

    from tokengrad.record.options import Attribution
    from tokengrad.train.models import make_tiny_model

    model = fully_shard(make_tiny_model(seed=0))
    with pytest.raises(
        ValueError, match=r"^tokengrad: Attribution\(on_spike=True\) is refused under sharded"
    ):
        Recorder(tmp_path / "run", model=model, attribution=Attribution(0, on_spike=True)).open()
    assert not (tmp_path / "run").exists()


def test_tensor_parallel_placements_are_refused_at_open(tmp_path, group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    model = torch.nn.Linear(4, 4)
    model.weight = torch.nn.Parameter(distribute_tensor(model.weight.detach(), mesh, [Replicate()]))
    with pytest.raises(ValueError, match=r"parameter weight is placed \(Replicate\(\),\) on a \(1,\) mesh"):
        Recorder(tmp_path / "run", model=model, buckets=2).open()
    assert not (tmp_path / "run").exists()


def test_agreement_without_others_returns_values_or_names_the_problem(monkeypatch):
    monkeypatch.setenv("TOKENGRAD_RANK_TIMEOUT_S", "5")
    one = RankAgreement.create()  # no process group: this process alone
    assert one.group is None and one.timeout_s == 5.0
    assert one.agree("bucket analysis", step=2, status=READY, values=[1, 0]) == [1.0, 0.0]
    with pytest.raises(
        RankAgreementError, match=r"^tokengrad: step 2: bucket analysis: this process tracked no pass"
    ):
        one.agree("bucket analysis", step=2, status=NO_PASS, values=[0, 0])
