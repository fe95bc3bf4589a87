"""The rollout engine's side of a verl actor update, through verl's own code: the driver's
`compute_rollout_correction_and_add_to_batch` (IS weights, rejection sampling, rollout_corr/* metrics) on a
DataProto, then verl's loss entry `ppo_loss` with tokengrad's loss on two micro-batches of that batch. The
recorded rollout_logprob, is_weight and masked_by are verl's tensors; the steps columns equal verl's
metrics on the same tensors. Runs in .venv-verl (scripts/verl_env.sh); skipped where verl is missing."""

from __future__ import annotations

import math

import pytest

verl = pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from tensordict import TensorDict  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo import rollout_corr_helper as helper  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils import losses  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import host  # noqa: E402
from tokengrad.integrations import verl as tg_verl  # noqa: E402
from tokengrad.integrations.verl import rollout  # noqa: E402

pytestmark = pytest.mark.verl
B, P, R = 6, 3, 8  # sequences, prompt length, response length
LENS = torch.tensor([8, 5, 7, 3, 8, 6])


def _rollout_batch(seed=0):
    """A verl driver batch after the old-log-prob pass: the engine's log mu = log pi_old - d with a
    healthy gap (|d| ~ 0.02) and a few tokens the engine disagrees on by about 1 nat."""
    g = torch.Generator().manual_seed(seed)
    response_mask = (torch.arange(R)[None] < LENS[:, None]).float()  # [B, R]
    old = -2 * torch.rand(B, R, generator=g)  # [B, R] log pi_old
    d = 0.02 * torch.randn(B, R, generator=g)  # [B, R]
    d[1, 2], d[3, 0], d[4, 6] = 1.1, -0.9, 1.3  # tokens far from the engine
    rollout_lp = (old - d) * response_mask  # [B, R] verl pads the engine's log-probs with 0
    adv = torch.tensor([1.0, -0.5, 0.8, -1.2, 0.3, -0.7])[:, None].expand(B, R).contiguous()
    return DataProto.from_dict(
        tensors={
            "prompts": torch.randint(0, 50, (B, P), generator=g),
            "responses": torch.randint(0, 50, (B, R), generator=g),
            "attention_mask": torch.cat([torch.ones(B, P), response_mask], 1).long(),
            "response_mask": response_mask,
            "old_log_probs": old,
            "rollout_log_probs": rollout_lp,
            "advantages": adv,
        }
    )


def _micro_batch(batch: DataProto, rows: slice):
    """The actor's micro-batch TensorDict of verl's loss entry and flat no-padding log_probs [nnz]."""
    fields = {k: v[rows] for k, v in batch.batch.items()}
    td = TensorDict(fields, batch_size=[rows.stop - rows.start])
    mask = fields["response_mask"]
    for key, value in (("dp_size", 1), ("batch_num_tokens", int(mask.sum())), ("global_batch_size", B)):
        tu.assign_non_tensor_data(td, key, value)
    att = fields["attention_mask"].bool()  # [b, P + R]
    # the model's log-probs: log pi_old + 0.1 on every response token (the policy after an update); the
    # engine's output at position P + j - 1 scores response token j (no_padding_2_padding shifts by one)
    resp = torch.zeros_like(att, dtype=torch.float)
    resp[:, P - 1 : P + R - 1] = fields["old_log_probs"] + 0.1
    shifted = resp[att]  # [nnz]
    return td, shifted.clone().requires_grad_(True)


def _config():
    return ActorConfig(
        strategy="fsdp",
        rollout_n=2,
        loss_agg_mode="token-mean",
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        policy_loss={"loss_mode": "tokengrad"},
        use_torch_compile=False,
        ppo_micro_batch_size_per_gpu=B,
    )


def _train_step(batch: DataProto):
    """One optimizer update of two micro-batches through verl's loss entry."""
    for rows in (slice(0, 3), slice(3, B)):
        td, log_probs = _micro_batch(batch, rows)
        losses.ppo_loss(_config(), {"log_probs": log_probs}, td)[0].backward()
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1).step()


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tg_verl.RUN_DIR_ENV, str(tmp_path / "run"))
    yield tmp_path / "run"
    tg_verl.close_recording()


def _recorded(run_dir):
    tg_verl.close_recording()
    run = load_run(run_dir)
    return run.tokens().sort_values(["sample_id", "position"]), run.steps.iloc[0]


def test_driver_wrapper_is_installed_by_the_plugin():
    assert helper.compute_rollout_correction_and_add_to_batch._tokengrad


@pytest.mark.parametrize(
    "rs, rs_threshold",
    [("token_k1", "0.5_2.0"), ("seq_max_k2", 0.3), ("token_k1,seq_mean_k3", "0.5_2.0,0.02")],
)
def test_token_is_and_rejection_sampling_equal_verls(run_dir, rs, rs_threshold):
    batch = _rollout_batch()
    pre_mask = batch.batch["response_mask"].bool().clone()
    cfg = {
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": rs,
        "rollout_rs_threshold": rs_threshold,
    }
    batch, metrics = helper.compute_rollout_correction_and_add_to_batch(batch, cfg)
    post_mask = batch.batch["response_mask"].bool()
    rejected = pre_mask & ~post_mask
    assert 0 < int(rejected.sum()) < int(pre_mask.sum())  # the case rejects some tokens, not all
    _train_step(batch)
    tok, steps = _recorded(run_dir)

    # every loss token before rejection is a row; the rejected ones carry rs_mask, no gradient, no loss
    assert len(tok) == int(pre_mask.sum())
    got = lambda col: torch.tensor(tok[col].to_numpy(dtype=float))  # noqa: E731
    assert torch.allclose(
        got("rollout_logprob"), batch.batch["rollout_log_probs"][pre_mask].double(), atol=1e-6
    )
    assert torch.allclose(got("is_weight"), batch.batch["rollout_is_weights"][pre_mask].double(), atol=1e-6)
    assert tok["masked"].fillna(False).to_numpy().tolist() == rejected[pre_mask].tolist()
    assert set(tok.loc[tok["masked"].fillna(False), "masked_by"]) == {"rs_mask"}
    assert tok["in_loss"].tolist() == post_mask[pre_mask].tolist()
    assert (tok.loc[~tok["in_loss"], "coef"] == 0).all() and (tok.loc[tok["in_loss"], "coef"] != 0).all()

    m = {k.removeprefix("rollout_corr/"): v for k, v in metrics.items()}
    pairs = {
        "rollout_kl_k1": "kl",
        "rollout_kl_k3": "k3_kl",
        "rollout_chi2_token": "chi2_token",
        "rollout_chi2_seq": "chi2_seq",
        "is_weight_mean": "rollout_is_mean",
        "is_weight_min": "rollout_is_min",
        "is_weight_max": "rollout_is_max",
        "is_ess": "rollout_is_eff_sample_size",
    }
    for ours, theirs in pairs.items():
        assert steps[ours] == pytest.approx(m[theirs], rel=1e-5, abs=1e-7), (ours, theirs)
    assert steps["rs_masked_tokens"] / pre_mask.sum().item() == pytest.approx(m["rollout_rs_masked_fraction"])
    assert steps["rs_masked_sequences"] / B == pytest.approx(m["rollout_rs_seq_masked_fraction"])
    assert steps["rs_masked_tokens"] == int(rejected.sum()) and steps["is_masked_tokens"] == 0
    d = (batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"])[pre_mask].abs()
    assert steps["rollout_mismatch"] == pytest.approx(d.mean().item(), rel=1e-5)
    assert steps["rollout_mismatch_max"] == pytest.approx(1.3, rel=1e-5)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_icepop_zero_weights_are_is_masks(run_dir, level):
    """IcePop (rollout_is_threshold "lower_upper"): verl zeroes weights outside the interval; those tokens
    (or sequences) are recorded as is_token_mask / is_sequence_mask, counted as verl counts them."""
    batch = _rollout_batch(seed=3)
    pre_mask = batch.batch["response_mask"].bool().clone()
    threshold = "0.5_2.0" if level == "token" else "0.9_1.1"
    cfg = {"rollout_is": level, "rollout_is_threshold": threshold}
    batch, metrics = helper.compute_rollout_correction_and_add_to_batch(batch, cfg)
    w = batch.batch["rollout_is_weights"]
    zero = (w == 0) & pre_mask
    assert 0 < int(zero.sum()) < int(pre_mask.sum())
    _train_step(batch)
    tok, steps = _recorded(run_dir)
    masked = tok["masked"].fillna(False).to_numpy()
    assert masked.tolist() == zero[pre_mask].tolist()
    assert set(tok.loc[masked, "masked_by"]) == {f"is_{level}_mask"}
    m = {k.removeprefix("rollout_corr/"): v for k, v in metrics.items()}
    assert steps["is_ess"] == pytest.approx(m["rollout_is_eff_sample_size"], rel=1e-5)
    assert steps["is_weight_mean"] == pytest.approx(m["rollout_is_mean"], rel=1e-5)
    if level == "token":
        assert steps["is_masked_tokens"] / pre_mask.sum().item() == pytest.approx(m["rollout_is_oob_ratio"])
        assert steps["is_weight_max"] == pytest.approx(m["rollout_is_max"], rel=1e-6)
    else:  # whole sequences: verl's sequence fraction below / above the interval counts them
        low, high = m["rollout_is_ratio_fraction_low"], m["rollout_is_ratio_fraction_high"]
        assert steps["is_masked_sequences"] == round((low + high) * B)
        assert steps["is_masked_tokens"] == int(zero.sum())
    assert math.isnan(steps["rs_masked_tokens"])  # no rejection sampling configured


def test_bypass_mode_records_no_gap_without_a_probe(run_dir):
    """Bypass: old_log_probs = rollout_log_probs; without the probe the gap is unknown, so rollout_logprob
    stays null (not a fake 0) and the gap metrics are absent."""
    batch = _rollout_batch(seed=4)
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"].clone()  # verl's apply_bypass_mode
    _train_step(batch)
    tok, steps = _recorded(run_dir)
    mask = batch.batch["response_mask"].bool()
    assert tok["rollout_logprob"].isna().all()
    assert torch.allclose(torch.tensor(tok["old_logprob"].to_numpy()), batch.batch["rollout_log_probs"][mask])
    assert math.isnan(steps["rollout_mismatch"]) and math.isnan(steps["rollout_kl_k3"])


def test_mask_codes_name_each_reason():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    w = torch.tensor([[1.0, 0.0, 1.5, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    rs = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 1]], dtype=torch.bool)
    code = host.mask_codes(mask, w, rs)
    bit = {n: 1 << i for i, n in enumerate(("is_sequence_mask", "is_token_mask", "off_policy_mask"))}
    rs_bit = 1 << 4
    assert code.tolist() == [
        [0, bit["is_token_mask"], 0, 0],
        [bit["is_sequence_mask"] | rs_bit, bit["is_sequence_mask"], 0, 0],
        [0, 0, rs_bit, rs_bit],
    ]


def test_bypass_is_recognised_with_unscored_tokens():
    """An engine's NaN (TRL #6166) copied into old_log_probs still reads as bypass; any real gap does not."""
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    mu = torch.tensor([[-0.5, float("nan"), -1.2, 0.0]])
    assert host.is_bypass(mu.clone(), mu, mask)
    assert not host.is_bypass(mu + torch.tensor([[0.0, 0.0, 1e-6, 0.0]]), mu, mask)
    assert not host.is_bypass(torch.tensor([[-0.5, -0.7, -1.2, 0.0]]), mu, mask)


def test_driver_wrapper_returns_verls_result_unchanged():
    cfg = {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "token_k1",
        "rollout_rs_threshold": 1.5,
    }
    plain_batch, plain_metrics = helper.compute_rollout_correction_and_add_to_batch.__wrapped__(
        _rollout_batch(), cfg
    )
    batch, metrics = helper.compute_rollout_correction_and_add_to_batch(_rollout_batch(), cfg)
    assert metrics == plain_metrics
    for key in plain_batch.batch.keys():
        assert torch.equal(batch.batch[key], plain_batch.batch[key]), key
    assert set(batch.batch.keys()) - set(plain_batch.batch.keys()) == {rollout.RS_KEY}
    rejected = _rollout_batch().batch["response_mask"].bool() & ~plain_batch.batch["response_mask"].bool()
    assert (
        torch.equal(batch.batch[rollout.RS_KEY], rejected) and int(rejected.sum()) == 3
    )  # the three far tokens


def test_v1_nested_layout(run_dir):
    """verl's v1 trainer hands the actor jagged nested fields (TransferQueue): the engine's log-probs are
    read from them alike, and the gap of exactly 0.03 per token comes out as such."""
    lens = [4, 2, 3]
    g = torch.Generator().manual_seed(0)
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    old = [-torch.rand(n, generator=g) for n in lens]
    td = TensorDict(
        {
            "prompts": nested([torch.randint(0, 9, (P,), generator=g) for _ in lens]),
            "responses": nested([torch.randint(0, 9, (n,), generator=g) for n in lens]),
            "response_mask": nested([torch.ones(n) for n in lens]),
            "old_log_probs": nested(old),
            "rollout_log_probs": nested([o - 0.03 for o in old]),
            "advantages": nested([torch.full((n,), a) for n, a in zip(lens, [1.0, -1.0, 0.5])]),
        },
        batch_size=[len(lens)],
    )
    for key, value in (("dp_size", 1), ("batch_num_tokens", sum(lens)), ("global_batch_size", len(lens))):
        tu.assign_non_tensor_data(td, key, value)
    log_probs = (-torch.rand(sum(P + n for n in lens), generator=g)).requires_grad_(True)
    losses.ppo_loss(_config(), {"log_probs": log_probs}, td)[0].backward()
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1).step()
    tok, steps = _recorded(run_dir)
    want = torch.cat(old) - 0.03
    assert torch.allclose(torch.tensor(tok["rollout_logprob"].to_numpy()), want, atol=1e-6)
    assert steps["rollout_mismatch"] == pytest.approx(0.03, rel=1e-5)
    assert steps["rollout_kl_k1"] == pytest.approx(-0.03, rel=1e-5)
    assert steps["n_rollout_nan"] == 0
