"""The OpenRLHF recorder (tokengrad.integrations.openrlhf) against OpenRLHF 0.11.2's own PolicyLoss.

OpenRLHF's real ActorPPOTrainer needs Ray, a DeepSpeed engine and vLLM, so a stand-in trainer with its
interface plays its part: `actor_loss_fn` is OpenRLHF's real `PolicyLoss` built in __init__, the
micro-batch is its real `Experience`, and `training_step(experience, kl_ctl, step, loss_batch_info)` runs
a bigram actor's forward with OpenRLHF's `log_probs_from_logits` (the last A positions, times the action
mask, as its Actor does), the loss call exactly as ppo_actor.py makes it, backward scaled by 1/accumulate
(what DeepSpeed's engine.backward does) and an optimizer step at the end of each accumulation window.
The plugin wraps the stand-in class as it wraps OpenRLHF's. Reference: autograd of a fresh PolicyLoss on
the captured tensors. OpenRLHF's modules come from scripts/openrlhf_env.sh's cache
(tests/openrlhf_source.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import openrlhf_source  # noqa: E402

if not openrlhf_source.available():
    pytest.skip(
        "OpenRLHF's source is not unpacked: run bash scripts/openrlhf_env.sh", allow_module_level=True
    )

from tokengrad import load_run  # noqa: E402
from tokengrad.doctor import examine  # noqa: E402
from tokengrad.integrations import openrlhf as tg  # noqa: E402

PolicyLoss = openrlhf_source.load("openrlhf.models.loss").PolicyLoss
aggregate_loss = openrlhf_source.load("openrlhf.models.loss").aggregate_loss
compute_approx_kl = openrlhf_source.load("openrlhf.models.utils").compute_approx_kl
Experience = openrlhf_source.load("openrlhf.trainer.ppo_utils.experience").Experience
log_probs_from_logits = openrlhf_source.load("openrlhf.models.utils").log_probs_from_logits

B, P, A, V = 4, 3, 5, 13  # sequences per micro-batch, prompt length, action span, vocabulary
LENS = torch.tensor([5, 3, 4, 2])  # response lengths (left-aligned in the action span)


class Actor(torch.nn.Module):
    """A bigram LM: the logits of the next token are a row of `table`."""

    temperature = 1.0

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(V, V))

    def forward(self, sequences, action_mask):
        logits = self.table[sequences]  # [B, S, V]
        rolled = torch.roll(sequences, shifts=-1, dims=1)  # OpenRLHF's Actor.forward: position i scores i+1
        log_probs = log_probs_from_logits(logits, rolled)[:, :-1]  # [B, S - 1]
        return log_probs[:, -action_mask.shape[1] :] * action_mask.float()  # [B, A]


class Trainer:
    """Stand-in for OpenRLHF's ActorPPOTrainer (see the module docstring)."""

    def __init__(self, accumulate=2, kl_coef=0.0, **loss_kwargs):
        self.actor = Actor()
        self.actor_loss_fn = PolicyLoss(**loss_kwargs)
        self.kl_coef = kl_coef  # OpenRLHF's KL loss (algo.kl.use_loss) with this coefficient, k3
        self.opt = torch.optim.SGD(self.actor.parameters(), lr=0.5)
        self.accumulate, self.calls, self.seen = accumulate, 0, []

    def training_step(self, experience, kl_ctl, step, loss_batch_info=None):
        lp = self.actor(experience.sequences, experience.action_mask)  # [B, A]
        self.seen.append((lp.detach().clone(), experience, dict(loss_batch_info)))
        actor_loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio = self.actor_loss_fn(
            lp,
            experience.action_log_probs,
            experience.advantages,
            action_mask=experience.action_mask,
            rollout_log_probs=experience.rollout_log_probs,
            **loss_batch_info,
        )
        loss = (
            actor_loss + self.kl_coef * _kl_loss(lp, experience, loss_batch_info)
            if self.kl_coef
            else actor_loss
        )
        (loss / self.accumulate).backward()
        self.calls += 1
        if self.calls % self.accumulate == 0:
            self.opt.step()
            self.opt.zero_grad()
        metrics = {"policy_loss": actor_loss.detach(), "actor_grad_norm": 0.25 * self.calls}
        return {"metrics": metrics, "weights": {}, "num_samples": float(B), "loss": actor_loss.detach()}


tg.wrap_trainer(Trainer)


def _kl_loss(lp, exp, info):
    """ppo_actor.py's KL loss on the same log-probs: OpenRLHF's k3 estimator against the reference."""
    kl = compute_approx_kl(
        lp, exp.base_action_log_probs, log_probs_old=exp.action_log_probs, kl_estimator="k3"
    )
    return aggregate_loss(kl, exp.action_mask, **info)


def _experience(seed, rollout=True, drift=0.3, gap=0.6):
    """A micro-batch: prompt + response ids; π_old: the starting actor's log-probs plus noise of scale
    `drift` (so that PPO's clip acts on some tokens), the engine's μ: π_old plus noise of scale `gap`."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, V, (B, P + A), generator=g)
    mask = torch.arange(A)[None] < LENS[:, None]  # [B, A] bool, as Experience.action_mask
    with torch.no_grad():
        old = (Actor()(seq, mask) + drift * torch.randn(B, A, generator=g)) * mask  # [B, A]
    adv = torch.tensor([1.0, -0.5, 0.8, -1.2])[:, None] * mask  # [B, A]: GRPO, one value per sequence
    mu = old + gap * torch.randn(B, A, generator=g) * mask if rollout else None
    ref = old + 0.2 * torch.randn(B, A, generator=g) * mask  # [B, A] the reference model's log-probs
    return Experience(
        sequences=seq,
        action_mask=mask,
        action_log_probs=old,
        base_action_log_probs=ref,
        advantages=adv,
        rollout_log_probs=mu,
    )


def _info(exp):
    """ppo_actor.py's loss_batch_info: the global token count (token mode) or sample count (sequence)."""
    return {"dp_size": 1, "batch_num_tokens": float(exp.action_mask.sum()) * 2, "global_batch_size": 2 * B}


def _train(trainer, n_calls=4, **data):
    for i in range(n_calls):
        exp = _experience(i, **data)
        status = trainer.training_step(exp, 0.0, i, _info(exp))
    tg.close_recording()
    return status


def _reference_coef(trainer, lp, exp, info, **loss_kwargs):
    """autograd of a fresh PolicyLoss (the trainer's settings; plus the KL loss where the trainer has one)
    w.r.t. the captured log-probs [B, A]."""
    leaf = lp.clone().requires_grad_(True)
    loss = PolicyLoss(**loss_kwargs)(
        leaf,
        exp.action_log_probs,
        exp.advantages,
        action_mask=exp.action_mask,
        rollout_log_probs=exp.rollout_log_probs,
        **info,
    )[0]
    if trainer.kl_coef:
        loss = loss + trainer.kl_coef * _kl_loss(leaf, exp, info)
    (grad,) = torch.autograd.grad(loss / trainer.accumulate, leaf)
    return grad


def _col(rows, name):
    return torch.tensor(rows[name].to_numpy(), dtype=torch.float64)


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tg.RUN_DIR_ENV, str(tmp_path / "run"))
    yield tmp_path / "run"
    tg.close_recording()


CONFIGS = {
    "token-mean, IS off": dict(),
    "seq-mean, IS off": dict(token_level_loss=False),
    "token-mean, token TIS mask": dict(is_correction_level="token", is_correction_threshold=(0.7, 1.4)),
    "seq-mean, token TIS mask": dict(
        token_level_loss=False, is_correction_level="token", is_correction_threshold=(0.7, 1.4)
    ),
    "token-mean, seq mask": dict(is_correction_level="seq", is_correction_threshold=(0.8, 1.25)),
    "seq-mean, seq mask": dict(
        token_level_loss=False, is_correction_level="seq", is_correction_threshold=(0.8, 1.25)
    ),
    "token clip, dual clip": dict(
        is_correction_level="token",
        is_correction_mode="clip",
        is_correction_threshold=(0.7, 1.4),
        dual_clip=3.0,
    ),
    "token binary_kl gate": dict(
        is_correction_level="token", is_correction_gating="binary_kl", is_correction_threshold=(0.0, 0.05)
    ),
    "gspo (sequence ratio)": dict(policy_loss_type="gspo", is_correction_level="seq"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_recorded_coef_is_autograd_of_openrlhfs_policy_loss(run_dir, name):
    """Two optimizer updates of two micro-batches each: each pass's coef equals autograd of OpenRLHF's own
    loss on the tensors it was given (with its 1/accumulate), the loss value is OpenRLHF's unchanged."""
    kwargs = CONFIGS[name]
    trainer = Trainer(**kwargs)
    _train(trainer)
    tok = load_run(run_dir).tokens().sort_values(["step", "pass_id", "sample_id", "position"])
    assert sorted(set(zip(tok["step"], tok["pass_id"], strict=True))) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for k, (lp, exp, info) in enumerate(trainer.seen):
        rows = tok[(tok["step"] == k // 2) & (tok["pass_id"] == k % 2)]
        mask = exp.action_mask
        want = _reference_coef(trainer, lp, exp, info, **kwargs)[mask]
        assert len(rows) == int(mask.sum())
        got = _col(rows, "coef")
        assert torch.allclose(got, want.double(), rtol=1e-5, atol=1e-9), (name, k)
        assert rows["token_id"].tolist() == exp.sequences[:, -A:][mask].tolist()
        assert torch.allclose(_col(rows, "old_logprob"), exp.action_log_probs[mask].double())
        assert torch.allclose(_col(rows, "logprob"), lp[mask].double(), atol=1e-6)
        assert torch.allclose(_col(rows, "advantage"), exp.advantages[mask].double())
    assert (tok["coef"] != 0).any()


def test_coef_includes_the_kl_loss_built_on_the_same_log_probs(run_dir):
    kwargs = dict(is_correction_level="token", is_correction_threshold=(0.7, 1.4))
    trainer = Trainer(kl_coef=0.5, **kwargs)
    _train(trainer, n_calls=2)
    tok = load_run(run_dir).tokens().sort_values(["pass_id", "sample_id", "position"])
    want = torch.cat(
        [_reference_coef(trainer, lp, e, i, **kwargs)[e.action_mask] for lp, e, i in trainer.seen]
    )
    without = torch.cat(
        [_reference_coef(Trainer(**kwargs), lp, e, i, **kwargs)[e.action_mask] for lp, e, i in trainer.seen]
    )
    assert torch.allclose(_col(tok, "coef"), want.double(), rtol=1e-5, atol=1e-9)
    assert not torch.allclose(want, without, rtol=1e-3)  # the KL term is not negligible here


def _expected_is_weights(exp, level, mode, low, high):
    """OpenRLHF's IS correction, by its definition (loss.py's comments and the ecosystem notes): the
    per-token ratio w = π_old/μ; the gated statistic is w itself (token) or the geometric mean of w over the
    sequence's action tokens (seq); mask drops units outside [low, high] (w kept otherwise), clip clamps w."""
    d = (exp.action_log_probs - exp.rollout_log_probs).double()  # [B, A]
    w = d.exp()
    m = exp.action_mask
    if mode == "clip":
        return w.clamp(low, high)
    stat = w if level == "token" else ((d * m).sum(-1) / m.sum(-1)).exp()[:, None].expand_as(w)
    return torch.where((stat >= low) & (stat <= high), w, 0.0)


@pytest.mark.parametrize(
    "level, mode, band",
    [("token", "mask", (0.7, 1.4)), ("seq", "mask", (0.8, 1.25)), ("token", "clip", (0.7, 1.4))],
)
def test_is_weights_and_masks_are_those_the_loss_applied(run_dir, level, mode, band):
    trainer = Trainer(is_correction_level=level, is_correction_mode=mode, is_correction_threshold=band)
    _train(trainer, n_calls=2)
    run = load_run(run_dir)
    tok = run.tokens().sort_values(["pass_id", "sample_id", "position"])
    want = torch.cat([_expected_is_weights(e, level, mode, *band)[e.action_mask] for _, e, _ in trainer.seen])
    got = _col(tok, "is_weight")
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-7)
    mu = torch.cat([e.rollout_log_probs[e.action_mask] for _, e, _ in trainer.seen]).double()
    assert torch.allclose(_col(tok, "rollout_logprob"), mu)
    zero = (want == 0).numpy()
    if mode == "mask":
        assert zero.any() and not zero.all(), "the band must drop some tokens and keep others"
        # the shared rule (tokengrad.integrations.host.mask_codes): is_sequence_mask where the
        # weights zero all of the sequence's tokens, is_token_mask where they zero some
        whole = torch.cat(
            [
                ((w == 0) | ~e.action_mask).all(-1, keepdim=True).expand_as(w)[e.action_mask]
                for w, e in ((_expected_is_weights(e, level, mode, *band), e) for _, e, _ in trainer.seen)
            ]
        )[torch.from_numpy(zero)]
        want_by = ["is_sequence_mask" if x else "is_token_mask" for x in whole.tolist()]
        assert tok["masked_by"][zero].tolist() == want_by
        assert {"token": "is_token_mask", "seq": "is_sequence_mask"}[level] in want_by
        assert tok["masked_by"][~zero].isna().all()
        assert (tok["coef"][zero] == 0).all()
    steps = run.steps.iloc[0]
    assert steps["is_weight_mean"] == pytest.approx(float(want.mean()), rel=1e-6)
    assert steps["is_masked_tokens"] == int(zero.sum())
    k1 = torch.cat([(e.action_log_probs - e.rollout_log_probs)[e.action_mask] for _, e, _ in trainer.seen])
    assert steps["rollout_kl_k1"] == pytest.approx(-float(k1.double().mean()), rel=1e-6)


def test_without_rollout_log_probs_no_gap_is_recorded(run_dir):
    """IS correction off and no engine log-probs (OpenRLHF requests them from vLLM only with IS on)."""
    _train(Trainer(), n_calls=2, rollout=False)
    run = load_run(run_dir)
    assert run.tokens()["rollout_logprob"].isna().all()
    assert run.tokens()["is_weight"].isna().all()
    assert "rollout_kl_k1" not in run.steps or run.steps["rollout_kl_k1"].isna().all()


def test_steps_meta_grad_norm_and_doctor(run_dir):
    """One step per optimizer update (two micro-batches each), OpenRLHF's actor_grad_norm as ds_grad_norm
    of the update's training step, the loss settings in meta.json, and the doctor reads the run."""
    kwargs = dict(is_correction_level="token", is_correction_threshold=(0.5, 5.0), dual_clip=3.0)
    _train(Trainer(**kwargs), n_calls=6, drift=0.02, gap=0.1)  # a trainer near its engine
    run = load_run(run_dir)
    steps = run.steps.sort_values("step")
    assert steps["step"].tolist() == [0, 1, 2]
    assert steps["ds_grad_norm"].tolist() == [0.5, 1.0, 1.5]  # the stand-in reports 0.25 x calls
    assert steps["n_tokens"].tolist() == [2 * int(LENS.sum())] * 3
    config = run.meta["config"]
    assert config["integration"] == "openrlhf"
    assert config["policy_loss"]["is_correction_level"] == "token"
    assert config["policy_loss"]["is_correction_threshold"] == [0.5, 5.0]
    assert config["policy_loss"]["dual_clip"] == 3.0
    assert run.meta["temperature"] == 1.0
    diagnosis = examine(run_dir)
    errors = [f for f in diagnosis.findings if f.id == "detector_error" or f.severity == "critical"]
    assert errors == [], [f.message for f in errors]


def test_wrapped_loss_returns_openrlhfs_values(run_dir):
    """The wrapper changes nothing OpenRLHF computes: the five outputs equal a fresh PolicyLoss's."""
    kwargs = dict(is_correction_level="token", is_correction_threshold=(0.7, 1.4))
    trainer = Trainer(**kwargs)
    exp = _experience(0)
    status = trainer.training_step(exp, 0.0, 0, _info(exp))
    lp, _, info = trainer.seen[0]
    want = PolicyLoss(**kwargs)(
        lp, exp.action_log_probs, exp.advantages, exp.action_mask, exp.rollout_log_probs, **info
    )
    assert torch.equal(status["loss"], want[0])
    assert trainer.actor_loss_fn.forward._tokengrad
    with torch.no_grad():  # a no-grad call (OpenRLHF's evaluation) records nothing and still answers
        out = trainer.actor_loss_fn(
            lp, exp.action_log_probs, exp.advantages, exp.action_mask, exp.rollout_log_probs
        )
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            out,
            PolicyLoss(**kwargs)(
                lp, exp.action_log_probs, exp.advantages, exp.action_mask, exp.rollout_log_probs
            ),
            strict=True,
        )
    )


def test_token_budget_from_the_environment(run_dir, monkeypatch):
    monkeypatch.setenv(tg.BUDGET_ENV, "7")
    _train(Trainer(), n_calls=2)
    run = load_run(run_dir)
    assert len(run.tokens()) <= 7
    assert run.steps["n_tokens"].tolist() == [2 * int(LENS.sum())]


def test_fp16_and_calls_outside_the_training_step_are_refused(run_dir):
    trainer = Trainer()
    trainer.actor.model = type("Engine", (), {"fp16_enabled": lambda self: True})()
    exp = _experience(0)
    with pytest.raises(RuntimeError, match="fp16.*loss scale"):
        trainer.training_step(exp, 0.0, 0, _info(exp))
    del trainer.actor.model
    trainer.training_step(exp, 0.0, 0, _info(exp))  # wraps actor_loss_fn
    lp = trainer.actor(exp.sequences, exp.action_mask)
    with pytest.raises(RuntimeError, match="Experience.*training_step"):
        trainer.actor_loss_fn(lp, exp.action_log_probs, exp.advantages, exp.action_mask)


def test_tested_version():
    assert tg.check_openrlhf_version(openrlhf_source.version())
    assert not tg.check_openrlhf_version("0.10.3") and not tg.check_openrlhf_version("0.12.0")
