"""tokengrad.train.updates without a model: the plan of a step's updates follows what the rule declares,
named settings in, named results out; and the trainer package's entry point."""

import contextlib
import math

import pytest
import torch

import tokengrad
from tokengrad.objective.weighting import WEIGHTINGS, TokenWeights, get_weighting, register_weighting
from tokengrad.train import batch as tb
from tokengrad.train.updates import (
    GRPOUpdate,
    LossSettings,
    Policy,
    Schedule,
    UpdateStats,
    Weighting,
    reuses_old_logprobs,
)

CALLS = []


@pytest.fixture
def counted():
    """A pointwise rule without phases that counts its calls."""

    @register_weighting("counted_for_updates_test", pointwise=True)
    def counted(batch):
        CALLS.append(1)
        return TokenWeights()

    CALLS.clear()
    yield get_weighting("counted_for_updates_test")
    WEIGHTINGS.unregister("counted_for_updates_test")


def _batch(p_old: list[list[float]]) -> tb.Batch:
    old = torch.tensor(p_old).log()  # [N, T]
    n, t = old.shape
    return tb.Batch(
        input_ids=torch.zeros(n, 2 + t, dtype=torch.long),
        attention_mask=torch.ones(n, 2 + t),
        prompt_len=2,
        completion_ids=torch.zeros(n, t, dtype=torch.long),
        mask=torch.ones(n, t),
        loss_mask=torch.ones(n, t),
        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5][:n]),
        old_logprobs=old,
        ref_logprobs=None,
        rollout_logprobs=torch.full((n, t), math.nan),
        is_weights=None,
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n) // 2,
    )


def _updates(rule, params=None, **schedule) -> GRPOUpdate:
    policy = Policy(
        model=None,
        forward=None,
        opt=None,
        temperature=1.0,
        autocast=contextlib.nullcontext,
        device=torch.device("cpu"),
    )
    loss = LossSettings(eps_low=0.2, eps_high=0.2, beta=0.0, aggregation="grpo", clip_ratio_c=0.0, max_len=4)
    sched = Schedule(
        **{"num_iterations": 1, "mini_batches": 1, "grad_accum": 2, "grad_clip": 1.0, **schedule}
    )
    return GRPOUpdate(policy, Weighting(rule, params or {}), loss, sched, reuse_old_logprobs=True)


P_OLD = [[0.1, 0.6, 0.9], [0.4, 0.5, 0.7], [0.2, 0.8, 0.3], [0.6, 0.05, 0.95]]


def test_a_rule_without_phases_is_not_run_to_plan_the_step(counted):
    plan = _updates(counted, num_iterations=2, mini_batches=2).plan(_batch(P_OLD))
    assert CALLS == []  # declared without phases: nothing to find out by running it
    # 2 epochs x 2 mini-batches of rows [0, 1] and [2, 3], 2 micro-batches of one row each
    assert [u.rows.tolist() for u in plan] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    assert all([m.tolist() for m in u.micro] == [[0], [1]] for u in plan)
    assert all(torch.equal(u.phase, torch.ones(4, 3)) for u in plan)


def test_lopti_plans_one_update_per_declared_phase_from_p_old():
    plan = _updates(get_weighting("lopti"), {"eta": 0.5}).plan(_batch(P_OLD))
    low = torch.tensor([[1, 0, 0], [1, 0, 0], [1, 0, 1], [0, 1, 0]], dtype=torch.float)  # p_old < 0.5
    assert len(plan) == 2
    assert torch.equal(plan[0].phase, low) and torch.equal(plan[1].phase, 1 - low)  # low first, then the rest
    assert _updates(get_weighting("lopti")).plan(None) == []


def test_reuse_of_the_loss_pass_follows_the_declaration(counted):
    one = Schedule(num_iterations=1, mini_batches=1, grad_accum=4, grad_clip=0.0)
    assert _updates(counted).reuses_old  # pointwise, no phases, one update
    assert not reuses_old_logprobs(True, one, Weighting(get_weighting("lopti"), {}), None)  # phases
    assert not reuses_old_logprobs(True, one, Weighting(get_weighting("cw_grpo"), {}), None)  # batch stats
    assert not reuses_old_logprobs(True, one, Weighting(counted, {}), correction=object())
    assert not reuses_old_logprobs(True, one._replace(num_iterations=2), Weighting(counted, {}), None)
    assert not reuses_old_logprobs(False, one, Weighting(counted, {}), None)


def test_update_stats_log_what_is_set():
    stats = UpdateStats(loss=0.25, grad_norm=1.5, n_updates=2, kl=None)
    assert stats.scalars() == {"loss": 0.25, "grad_norm": 1.5, "n_updates": 2}
    assert UpdateStats(loss=None, grad_norm=None, n_updates=0, kl=None).scalars() == {"n_updates": 0}


def test_the_trainer_package_is_not_the_entry_point(monkeypatch):
    from tokengrad.train import trainer

    monkeypatch.setattr(trainer, "train", lambda *a, **k: ("ran", a, k))
    assert tokengrad.train.run("c.toml", steps=2) == ("ran", ("c.toml",), {"steps": 2})
    assert not callable(tokengrad.train)  # a package, not a function: no module class swapped in
    assert type(tokengrad.train) is type(pytest)
