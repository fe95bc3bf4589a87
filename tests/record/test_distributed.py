"""Distributed helpers in one process: rank facts, global grad norms, the per-rank loss scale that makes
the update equal one process on the whole batch, and the even split of prompts (the torchrun runs that
check the same end to end are in test_multiprocess.py)."""

import pytest
import torch


def test_distributed_helpers_in_one_process(monkeypatch, tiny_model, batch):
    from tokengrad.record.gradnorms import grad_norms, trainable_params
    from tokengrad.train import distributed as dist

    assert (dist.rank(), dist.world_size(), dist.is_main()) == (0, 1, True)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")  # set by torchrun before the process group exists
    assert (dist.rank(), dist.world_size(), dist.is_main()) == (3, 4, False)
    assert dist.all_reduce([1.5, 2.0]).tolist() == [1.5, 2.0]  # no process group: the values themselves
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


def test_loss_weights_turn_per_rank_means_into_the_global_mean(monkeypatch):
    """Two simulated ranks with unequal rows and tokens (as after dynamic sampling): each rank's micro-batch
    losses, weighted by micro_batch_share x rank_scale and averaged over ranks as DDP averages gradients,
    have the gradient of the loss over the whole batch, for every aggregation."""
    from tokengrad.objective.loss import micro_batch_share, normaliser, policy_loss
    from tokengrad.train import distributed as dist

    g = torch.Generator().manual_seed(0)
    N, T = 5, 6
    old = -torch.rand(N, T, generator=g) * 3  # [N, T]
    adv = torch.randn(N, generator=g)  # [N]
    mask = (torch.arange(T)[None, :] < torch.tensor([6, 2, 4, 1, 5])[:, None]).float()  # [N, T] 18 tokens
    ranks = [[[0, 1], [2]], [[3, 4]]]  # rank 0: rows 0-2 in two micro-batches; rank 1: rows 3-4
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    for agg in ("grpo", "dapo", "dr_grpo"):
        lp = (old + 0.1 * torch.randn(N, T, generator=g)).requires_grad_()  # [N, T]
        policy_loss(lp, old, adv, mask, aggregation=agg, max_len=T).loss.backward()
        want, lp.grad = lp.grad.clone(), None
        # all ranks' counts: rows 3 + 2 = 5 (grpo, dr_grpo); loss tokens (6 + 2 + 4) + (1 + 5) = 18 (dapo)
        total = sum(normaliser(agg, mask[sum(micro, [])]) for micro in ranks)
        assert total == (18 if agg == "dapo" else 5)
        monkeypatch.setattr(
            dist, "all_reduce", lambda values, op="sum": torch.tensor([total], dtype=torch.float64)
        )
        naive = torch.zeros(N, T)
        for micro in ranks:
            rows = sum(micro, [])
            weight = dist.rank_scale(normaliser(agg, mask[rows]))
            for m in micro:
                loss = policy_loss(lp[m], old[m], adv[m], mask[m], aggregation=agg, max_len=T).loss
                share = micro_batch_share(agg, mask[m], mask[rows])
                naive += torch.autograd.grad(loss * share, lp, retain_graph=True)[0]
                (loss * share * weight).backward()
        # DDP averages the ranks' gradients: each rank's coefficients count 1 / world_size
        torch.testing.assert_close(lp.grad / 2, want, rtol=1e-5, atol=1e-7)
        assert not torch.allclose(naive / 2, want, atol=1e-4), agg  # unweighted per-rank means are off


def test_prompts_must_split_evenly_over_processes(tmp_path, monkeypatch):
    from tokengrad.train.trainer import train

    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it, before any process group exists
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(
        ValueError, match=r"prompts_per_step = 3 must be divisible by the number of processes \(2\)"
    ):
        train(dict(model="tiny", task="kk", prompts_per_step=3, run_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()
