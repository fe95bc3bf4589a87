"""tokengrad inside the real verl package: losses registered through verl's plugin entry point, called through
verl's own loss entry (`verl.workers.utils.losses.ppo_loss`) with verl's data structures (ActorConfig,
TensorDict), the recorded coef against autograd of verl's loss for every aggregation mode, and rows
readable with load_run. Runs in .venv-verl (scripts/verl_env.sh); skipped where verl is not installed."""

from __future__ import annotations

import pytest

verl = pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils import losses  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import verl as tg_verl  # noqa: E402
from tokengrad.objective.weighting import TokenBatch, get_weighting  # noqa: E402

pytestmark = pytest.mark.verl
AGG_MODES = [
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
B, P, R = 4, 3, 6  # sequences, prompt length, response length


def _batch(seed=0):
    """verl's actor-update TensorDict (left-right padded prompts/responses) and the flat log_probs
    [total_nnz] a no-padding engine forward returns, as a leaf so autograd can differentiate verl's loss."""
    g = torch.Generator().manual_seed(seed)
    resp_len = torch.tensor([6, 4, 5, 2])
    response_mask = (torch.arange(R)[None] < resp_len[:, None]).float()  # [B, R]
    attention_mask = torch.cat([torch.ones(B, P), response_mask], 1).long()  # [B, P + R]
    nnz = int(attention_mask.sum())
    log_probs = (-3 * torch.rand(nnz, generator=g)).requires_grad_(True)  # [nnz]
    old = -3 * torch.rand(B, R, generator=g)  # [B, R]
    adv = torch.tensor([1.0, -0.5, 0.8, -1.2])[:, None].expand(B, R).contiguous()  # [B, R] GRPO: per sequence
    data = TensorDict(
        {
            "prompts": torch.randint(0, 50, (B, P), generator=g),
            "responses": torch.randint(0, 50, (B, R), generator=g),
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "old_log_probs": old,
            "advantages": adv,
        },
        batch_size=[B],
    )
    for key, value in (
        ("dp_size", 1),
        ("batch_num_tokens", int(response_mask.sum())),
        ("global_batch_size", B),
    ):
        tu.assign_non_tensor_data(data, key, value)
    return data, log_probs


def _config(loss_mode, agg):
    return ActorConfig(
        strategy="fsdp",
        rollout_n=2,
        loss_agg_mode=agg,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        policy_loss={"loss_mode": loss_mode},
        use_torch_compile=False,
        ppo_micro_batch_size_per_gpu=B,
    )


def _padded_grad(data, log_probs, loss_mode, agg):
    """autograd of verl's loss w.r.t. the padded log_prob [B, R] it is built from."""
    from verl.workers.utils.padding import no_padding_2_padding

    loss = losses.ppo_loss(_config(loss_mode, agg), {"log_probs": log_probs}, data)[0]
    (g_flat,) = torch.autograd.grad(loss, log_probs)
    return no_padding_2_padding(g_flat, data)  # [B, R]: the same slice ppo_loss takes


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tg_verl.RUN_DIR_ENV, str(tmp_path / "run"))
    yield tmp_path / "run"
    tg_verl.close_recording()


def test_plugin_entry_point_registered_the_losses():
    """`import verl` loaded tokengrad's entry point: the names are in verl's own registry, and the loss entry
    (which verl/workers/engine_workers.py binds when it is imported, after the plugin) is the wrapped one."""
    assert losses.ppo_loss._tokengrad
    assert losses.ppo_loss.__wrapped__.__module__ == "verl.workers.utils.losses"
    for name in ("tokengrad", "tokengrad_tr_grpo", "tokengrad_ar", "tokengrad_cw_grpo"):
        assert name in POLICY_LOSS_REGISTRY, sorted(POLICY_LOSS_REGISTRY)
    assert tg_verl.check_verl_version(verl.__version__)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_recorded_coef_is_autograd_of_verls_loss(run_dir, agg):
    data, log_probs = _batch()
    want = _padded_grad(data, log_probs, "vanilla", agg)  # [B, R]
    loss, metrics = losses.ppo_loss(_config("tokengrad", agg), {"log_probs": log_probs}, data)
    loss.backward()
    assert torch.allclose(loss, losses.ppo_loss(_config("vanilla", agg), {"log_probs": log_probs}, data)[0])
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1).step()  # an optimizer update ends the step
    tg_verl.close_recording()
    run = load_run(run_dir)
    tok = run.tokens().sort_values(["sample_id", "position"])
    mask = data["response_mask"].bool()
    assert len(tok) == int(mask.sum()) and set(tok["step"]) == {0}
    coef = torch.tensor(tok["coef"].to_numpy())
    assert torch.allclose(coef, want[mask].float(), rtol=1e-5, atol=1e-9), agg
    assert torch.allclose(torch.tensor(tok["old_logprob"].to_numpy()), data["old_log_probs"][mask])
    assert tok["token_id"].tolist() == data["responses"][mask].tolist()
    assert run.meta["config"]["loss_mode"] == "tokengrad"


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_tr_grpo_scales_each_tokens_gradient(run_dir, agg):
    data, log_probs = _batch(seed=1)
    plain = _padded_grad(data, log_probs, "vanilla", agg)  # [B, R]
    loss, _ = losses.ppo_loss(_config("tokengrad_tr_grpo", agg), {"log_probs": log_probs}, data)
    loss.backward()
    from verl.workers.utils.padding import no_padding_2_padding

    lp = no_padding_2_padding(log_probs.detach(), data)  # [B, R]
    w = get_weighting("tr_grpo")(
        TokenBatch(
            logprobs=lp,
            old_logprobs=data["old_log_probs"],
            advantages=data["advantages"],
            mask=data["response_mask"],
        )
    ).effective()  # [B, R]
    mask = data["response_mask"].bool()
    got = no_padding_2_padding(log_probs.grad, data)  # the gradient that reached the model
    assert torch.allclose(got[mask], (w * plain)[mask], rtol=1e-5, atol=1e-9)
    assert not torch.allclose(w[mask], torch.ones_like(w[mask]))  # the rule did reweight
    tg_verl.close_recording()
    tok = load_run(run_dir).tokens().sort_values(["sample_id", "position"])
    assert torch.allclose(torch.tensor(tok["weight"].to_numpy()), w[mask].float(), rtol=1e-5)
    assert torch.allclose(
        torch.tensor(tok["coef"].to_numpy()), (w * plain)[mask].float(), rtol=1e-5, atol=1e-9
    )
    assert load_run(run_dir).meta["weighting"]["name"] == "tr_grpo"


def test_token_budget_from_the_environment(run_dir, monkeypatch):
    monkeypatch.setenv(tg_verl.BUDGET_ENV, "7")
    data, log_probs = _batch(seed=5)
    losses.ppo_loss(_config("tokengrad", "token-mean"), {"log_probs": log_probs}, data)[0].backward()
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1).step()
    tg_verl.close_recording()
    run = load_run(run_dir)
    assert run.meta["token_budget"] == 7
    assert 0 < len(run.tokens()) <= 7 < int(data["response_mask"].sum())


def test_each_optimizer_update_is_a_step_readable_while_running(run_dir):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    for update in range(3):
        for micro in range(2):  # two micro-batches accumulate into one update
            data, log_probs = _batch(seed=10 * update + micro)
            losses.ppo_loss(_config("tokengrad", "token-mean"), {"log_probs": log_probs}, data)[0].backward()
        opt.step()
    tg_verl.recording().recorder.flush()
    run = load_run(run_dir)  # the recording is still open
    tok = run.tokens()
    assert sorted(tok["step"].unique()) == [0, 1, 2]
    assert tok.groupby("step")["pass_id"].nunique().tolist() == [2, 2, 2]
    assert tok.groupby(["step", "sample_id"]).ngroups == 3 * 2 * B
    assert not run.meta["finished"]
