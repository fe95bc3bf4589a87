"""The doctor's conformance cases (tests/conformance_cases.py) made through the verl plugin: each step is one
micro-batch through verl's own loss entry (`verl.workers.utils.losses.ppo_loss`), laid out as verl's
legacy trainer hands it over (padded, then verl's `left_right_2_no_padding`, the rollout temperature in the
batch), and one optimizer update. The plugin sees the log-probs, the entropies, the advantages and verl's
config, not the rewards or the gradient norm: the cases it can make give the table's finding id and
severity, the others are listed as not checked with the missing column named. Runs in .venv-verl."""

from __future__ import annotations

import math

import pytest

verl = pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from conformance_cases import LIMIT, N_STEPS, PROMPTS, G, expected  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils import losses  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

from tokengrad.doctor.engine import examine  # noqa: E402
from tokengrad.doctor.view import RunView  # noqa: E402
from tokengrad.integrations import verl as tg_verl  # noqa: E402

pytestmark = pytest.mark.verl
B, P, EOS, TEMPERATURE = G * PROMPTS, 3, 2, 0.7
MADE = ["truncation", "nan_loss", "entropy_collapse", "clip_saturation"]
# what the loss seam cannot see: the detector, and the column its reason names
UNSEEN = {
    "dead_steps": ("dead_steps", "grad_norm"),
    "nan_reward": ("reward_nonfinite", "samples"),
    "constant_reward": ("reward_std_death", "reward_std"),
}


def _config() -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=G,
        loss_agg_mode="token-mean",
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        policy_loss={"loss_mode": "tokengrad"},
        use_torch_compile=False,
        ppo_micro_batch_size_per_gpu=B,
    )


def _step_tensors(step: int, case: str) -> dict:
    """The step's response lengths, token ids, advantages, old and new log-probs and entropies [B, LIMIT]."""
    g = torch.Generator().manual_seed(step)
    bad = step >= 2
    lengths = torch.tensor([3 + i % 4 for i in range(B)])  # healthy: end early, with EOS
    if case == "truncation" and bad:
        lengths = torch.full((B,), LIMIT)  # every completion stops at the limit, no EOS
    mask = torch.arange(LIMIT)[None] < lengths[:, None]  # [B, R]
    ids = torch.randint(3, 50, (B, LIMIT), generator=g) * mask  # [B, R]
    if not (case == "truncation" and bad):
        ids[torch.arange(B), lengths - 1] = EOS
    adv = torch.tensor([(-1.0) ** i * (0.5 + 0.1 * (i % 3)) for i in range(B)])[:, None].expand(B, LIMIT)
    old = -1.0 - torch.rand(B, LIMIT, generator=g)  # [B, R]
    new = old + 0.01 * torch.randn(B, LIMIT, generator=g)  # ratio ~ 1: nothing clipped
    if case == "clip_saturation" and bad:
        new = old + adv.sign()  # ratio e or 1/e, past 1 + 0.28 for A > 0 and 1 - 0.2 for A < 0: clipped
    if case == "nan_loss" and step == 12:
        new[0, 0] = math.nan
    h = 0.5 + 0.01 * math.sin(3 * step)
    if case == "entropy_collapse":
        h = 0.5 * 0.8**step
    entropy = torch.full((B, LIMIT), h)  # [B, R]
    return dict(mask=mask, ids=ids, adv=adv.contiguous(), old=old, new=new, entropy=entropy)


def _flat(padded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The engine's no-padding output [nnz] whose `no_padding_2_padding` is `padded` on the response: the
    value of response token j sits at prompt length - 1 + j of its sequence (the logits predict it)."""
    rows = [
        torch.cat([torch.zeros(P - 1), padded[i, : int(mask[i].sum())], torch.zeros(1)]) for i in range(B)
    ]
    return torch.cat(rows)


def _micro_batch(t: dict, limit_known: bool) -> tuple[TensorDict, dict]:
    """The actor-update micro-batch as verl's legacy trainer builds it, and the engine's model output."""
    mask = t["mask"].float()
    attention = torch.cat([torch.ones(B, P), mask], 1).long()  # [B, P + R]
    data = TensorDict(
        {
            "prompts": torch.randint(3, 50, (B, P)),
            "responses": t["ids"],
            "input_ids": torch.cat([torch.randint(3, 50, (B, P)), t["ids"]], 1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
            "response_mask": mask,
            "old_log_probs": t["old"],
            "advantages": t["adv"],
        },
        batch_size=[B],
    )
    if limit_known:
        data = left_right_2_no_padding(data)  # sets max_response_len = the padded width (LIMIT)
    for key, value in (
        ("dp_size", 1),
        ("batch_num_tokens", int(mask.sum())),
        ("global_batch_size", B),
        ("temperature", TEMPERATURE),  # ray_trainer._update_actor: batch.meta_info["temperature"]
    ):
        tu.assign_non_tensor_data(data, key, value)
    out = {
        "log_probs": _flat(t["new"], t["mask"]).requires_grad_(True),
        "entropy": _flat(t["entropy"], t["mask"]),
    }
    return data, out


def write_verl_run(run_dir, case: str, monkeypatch, limit_known: bool = True):
    monkeypatch.setenv(tg_verl.RUN_DIR_ENV, str(run_dir))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    try:
        for step in range(N_STEPS):
            data, out = _micro_batch(_step_tensors(step, case), limit_known)
            losses.ppo_loss(_config(), out, data)[0].backward()
            opt.step()  # the update ends the tokengrad step
    finally:
        tg_verl.close_recording()


@pytest.mark.parametrize("case", MADE)
def test_a_pathology_the_plugin_sees_gets_the_same_finding(tmp_path, monkeypatch, case):
    write_verl_run(tmp_path / case, case, monkeypatch)
    result = examine(tmp_path / case)
    got = {(f.id, f.severity) for f in result.findings}
    assert expected(case) in got, (got, [str(n) for n in result.not_checked])


@pytest.mark.parametrize("case", list(UNSEEN))
def test_a_pathology_the_plugin_cannot_see_is_not_checked_by_name(tmp_path, monkeypatch, case):
    write_verl_run(tmp_path / case, case, monkeypatch)
    result = examine(tmp_path / case)
    detector, column = UNSEEN[case]
    assert detector == expected(case)[0]  # the table's detector, which could not look
    assert detector not in {f.id for f in result.findings}
    why = {n.detector: n.reason for n in result.not_checked}
    assert column in why[detector], why


def test_a_healthy_verl_run_has_no_warning(tmp_path, monkeypatch):
    write_verl_run(tmp_path / "ok", "healthy", monkeypatch)
    result = examine(tmp_path / "ok")
    assert [f.id for f in result.findings if f.at_least("warning")] == []
    checked = {"truncation", "entropy_collapse", "clip_saturation", "nonfinite", "zeroed_gradients"}
    assert not checked & {n.detector for n in result.not_checked}


def test_the_plugin_records_verls_settings(tmp_path, monkeypatch):
    write_verl_run(tmp_path / "ok", "healthy", monkeypatch)
    view = RunView.open(tmp_path / "ok")
    s = view.settings
    assert (s.producer, s.max_new_tokens, s.group_size, s.loss_type) == ("verl", LIMIT, G, "token-mean")
    assert (s.eps_low, s.eps_high, s.num_iterations, s.temperature) == (0.2, 0.28, 1, TEMPERATURE)
    assert s.beta is None  # use_kl_loss is off: the seam cannot tell a KL in the reward
    assert view.meta["config"]["response_length"] == LIMIT and view.meta["temperature"] == TEMPERATURE
    steps = view.steps.set_index("step")
    assert steps["entropy_mean"].tolist() == pytest.approx(
        [0.5 + 0.01 * math.sin(3 * k) for k in range(N_STEPS)]
    )


def test_recorded_clip_fraction_is_verls_own(tmp_path, monkeypatch):
    """clip_frac from the plugin's `clipped` equals verl's pg_clipfrac + pg_clipfrac_lower on the same
    micro-batch, and the clipped tokens are those whose exact coef is 0."""
    monkeypatch.setenv(tg_verl.RUN_DIR_ENV, str(tmp_path / "clip"))
    t = _step_tensors(2, "clip_saturation")
    t["new"][: B // 2] = t["old"][: B // 2]  # half the sequences at ratio 1: not clipped
    data, out = _micro_batch(t, True)
    loss, metrics = losses.ppo_loss(_config(), out, data)
    loss.backward()
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1).step()
    tg_verl.close_recording()
    view = RunView.open(tmp_path / "clip")
    verl_frac = metrics["actor/pg_clipfrac"].aggregate() + metrics["actor/pg_clipfrac_lower"].aggregate()
    assert view.steps["clip_frac"].iloc[0] == pytest.approx(verl_frac) == pytest.approx(0.5)
    tok = view.run.tokens()
    assert (tok[tok["clipped"]]["coef"] == 0).all() and (tok[~tok["clipped"]]["coef"] != 0).all()


def test_without_the_batchs_length_limit_truncation_is_not_checked(tmp_path, monkeypatch):
    """verl's v1 trainer hands over jagged responses and no max_response_len: the limit is unknown."""
    write_verl_run(tmp_path / "v1", "truncation", monkeypatch, limit_known=False)
    result = examine(tmp_path / "v1")
    why = {n.detector: n.reason for n in result.not_checked}
    assert "truncation" not in {f.id for f in result.findings}
    assert why["truncation"].startswith("the length limit is unknown")
