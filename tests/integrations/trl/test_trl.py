"""The TRL integration against TRL's own loss: every recorded coef equals autograd of GRPOTrainer.compute_loss
recomputed on the same inputs and parameters, and a weighting changes gradients exactly by its weights."""

import json
import math
import warnings

import numpy as np
import pytest
import torch

from tokengrad.record import Attribution

trl = pytest.importorskip("trl")

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import trl as tg_trl  # noqa: E402
from tokengrad.record.stats import token_stats  # noqa: E402
from tokengrad.train.models import make_tiny_model, make_tiny_tokenizer  # noqa: E402

pytestmark = pytest.mark.trl
PROMPTS = ["abc", "hello", "x=1+", "what?"]
# TRL >= 1.15 scores log-probs through its fused LM head (no logits); 1.13 and 1.14 through full logits
FUSED_HEAD = hasattr(trl.trainer.utils, "add_fused_lm_head")


def distinct_chars(completions, **kwargs):
    """A reward with spread inside every group (random completions differ in how many characters repeat);
    a conversational completion is scored by its message's text."""
    return [len(set(completion_text(c))) / 8 for c in completions]


def completion_text(completion) -> str:
    """A standard completion as it is; a conversational one (a list of messages) as its last message."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


TINY = dict(  # what a CPU test run needs: tiny batches and lengths, a few steps, no trackers, fp32
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=8,
    max_steps=2,
    report_to="none",
    use_cpu=True,
    bf16=False,
    seed=0,
    disable_tqdm=True,
)
# these tests' settings on top: a log per update, no checkpoints, a learning rate that moves the tiny model
TEST_SETTINGS = dict(logging_steps=1, save_strategy="no", learning_rate=5e-2)


def make_trainer(
    tmp_path,
    loss_type="dapo",
    reward_funcs=(distinct_chars,),
    *,
    trl_defaults=False,
    conversational=False,
    trainer_kwargs=None,
    **overrides,
):
    """A tiny GRPOTrainer; `trl_defaults=True` leaves every GRPOConfig option but TINY at TRL's default
    (logging_steps=10 among them); `conversational` gives chat-message prompts; `trainer_kwargs` go to
    GRPOTrainer (eval_dataset, peft_config)."""
    from datasets import Dataset

    tok = make_tiny_tokenizer()
    cfg = dict(output_dir=str(tmp_path / "trl_out"), **TINY, loss_type=loss_type)
    cfg.update({} if trl_defaults else TEST_SETTINGS)
    cfg.update(overrides)
    model = make_tiny_model(tok)
    if cfg.get("beta", 0.0) != 0.0:  # TRL loads the reference model from the policy's path
        model.save_pretrained(tmp_path / "tiny")
        model.config._name_or_path = str(tmp_path / "tiny")
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS] if conversational else PROMPTS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return trl.GRPOTrainer(
            model=model,
            reward_funcs=list(reward_funcs),
            args=trl.GRPOConfig(**cfg),
            train_dataset=Dataset.from_dict({"prompt": prompts * 4}),
            processing_class=tok,
            **(trainer_kwargs or {}),
        )


def recompute(trainer, model, inputs):
    """TRL's loss on `inputs` at the current parameters, through the class method (not the recording):
    returns the log-probs it was built from and dL/dlog pi by autograd."""
    box = {}
    inner = trainer._get_per_token_logps_and_entropies

    def grab(*args, **kwargs):
        out = inner(*args, **kwargs)
        box["lp"] = out[0]
        return out

    trainer._get_per_token_logps_and_entropies = grab
    try:
        loss = trl.GRPOTrainer.compute_loss(trainer, model, inputs)
    finally:
        trainer._get_per_token_logps_and_entropies = inner
    return loss, box["lp"]


def brute_force_stats(trainer, inputs):
    """prob, entropy, sum_p2 and |h_t| / temperature from full logits of the plain (non-fused) forward."""
    model = trainer.model
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    T = inputs["completion_ids"].size(1)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=att, output_hidden_states=True)
    logits = out.logits[:, -T - 1 : -1].float() / trainer.temperature  # [B, T, V]
    stats = token_stats(logits, inputs["completion_ids"])
    return stats, out.hidden_states[-1][:, -T - 1 : -1].norm(dim=-1) / trainer.temperature


def capture_passes(trainer, weights_fn=None):
    """Wrap compute_loss outside the recording: per micro-batch, the inputs and TRL's recomputed coef."""
    passes = []
    inner = trainer.compute_loss

    def compute_loss(model, inputs, *args, **kwargs):
        loss = inner(model, inputs, *args, **kwargs)
        if torch.is_grad_enabled() and model.training:
            ref_loss, lp = recompute(trainer, model, inputs)
            (coef,) = torch.autograd.grad(ref_loss, lp, retain_graph=True)
            entry = dict(inputs=inputs, lp=lp.detach(), coef=coef, stats=brute_force_stats(trainer, inputs))
            if weights_fn is not None:
                params = [p for p in trainer.model.parameters() if p.requires_grad]
                w = weights_fn(lp.detach())
                entry["w"] = w
                entry["grad_weighted"] = torch.autograd.grad(
                    (w * coef).detach().mul(lp).sum(), params, retain_graph=True
                )
                entry["grad_plain"] = torch.autograd.grad(ref_loss, params)
            passes.append(entry)
        return loss

    trainer.compute_loss = compute_loss
    return passes


def rows_of(tokens, step, pass_id):
    return tokens[(tokens.step == step) & (tokens.pass_id == pass_id)]


def as_matrix(rows, column, sample_ids, shape):
    """Scatter recorded token rows back to the [B, T] layout of the pass (NaN where nothing was recorded)."""
    out = np.full(shape, np.nan)
    index = {int(s): i for i, s in enumerate(sample_ids.tolist())}
    for s, pos, v in zip(rows.sample_id, rows.position, rows[column]):
        out[index[int(s)], int(pos)] = v
    return torch.tensor(out)


CONFIGS = {
    # grpo with a reference model, two optimizer updates per generation and gradient accumulation
    "grpo": dict(beta=0.04, num_iterations=2, gradient_accumulation_steps=2, temperature=0.7),
    "dapo": dict(gradient_accumulation_steps=2),
    "dr_grpo": dict(num_iterations=2),
    # the other loss types, each on a second, off-policy update where their surrogates differ
    "bnpo": dict(num_iterations=2),
    "luspo": dict(num_iterations=2, importance_sampling_level="sequence"),
    "cispo": dict(num_iterations=2),
    "sapo": dict(num_iterations=2),
    "vespo": dict(num_iterations=2),
}


@pytest.mark.parametrize("loss_type", sorted(CONFIGS))
def test_recorded_coef_equals_autograd_of_trl_loss(tmp_path, loss_type):
    trainer = make_trainer(tmp_path, loss_type, **CONFIGS[loss_type])
    tg_trl.attach(trainer, tmp_path / "run")
    passes = capture_passes(trainer)
    trainer.train()
    run = load_run(tmp_path / "run")
    tokens = run.tokens()
    ga, mu = trainer.args.gradient_accumulation_steps, trainer.num_iterations
    assert run.meta["temperature"] == pytest.approx(CONFIGS[loss_type].get("temperature", 1.0))
    assert len(passes) == 2 * ga  # 2 optimizer steps x GA micro-batches
    assert len(run.steps) == math.ceil(2 / mu)  # one tokengrad step per generation batch
    checked = 0
    for k, p in enumerate(passes):
        step, pass_id = divmod(k, ga * mu)
        inp = p["inputs"]
        mask = inp["completion_mask"].bool()
        sid = inp[tg_trl.SAMPLE_KEY]
        rows = rows_of(tokens, step, pass_id)
        assert len(rows) == int(mask.sum())
        assert set(rows.update_id) == {pass_id // ga}
        coef = as_matrix(rows, "coef", sid, mask.shape)
        torch.testing.assert_close(coef[mask], p["coef"][mask].double(), rtol=1e-5, atol=1e-9)
        lp = as_matrix(rows, "logprob", sid, mask.shape)
        torch.testing.assert_close(lp[mask], p["lp"][mask].double(), rtol=1e-6, atol=1e-6)
        old = inp.get("old_per_token_logps", p["lp"])
        torch.testing.assert_close(
            as_matrix(rows, "old_logprob", sid, mask.shape)[mask], old[mask].double(), rtol=1e-6, atol=1e-6
        )
        adv = inp["advantages"][:, None].expand_as(mask)
        torch.testing.assert_close(as_matrix(rows, "advantage", sid, mask.shape)[mask], adv[mask].double())
        stats, hnorm = p["stats"]
        for col in ("prob", "entropy", "sum_p2"):
            torch.testing.assert_close(
                as_matrix(rows, col, sid, mask.shape)[mask],
                getattr(stats, col)[mask].double(),
                rtol=1e-4,
                atol=1e-6,
            )
        head = stats.logit_grad_unit * p["coef"].abs() * hnorm  # [B, T]
        torch.testing.assert_close(
            as_matrix(rows, "head_grad_norm", sid, mask.shape)[mask],
            head[mask].double(),
            rtol=1e-4,
            atol=1e-9,
        )
        if "ref_per_token_logps" in inp:
            torch.testing.assert_close(
                as_matrix(rows, "ref_logprob", sid, mask.shape)[mask],
                inp["ref_per_token_logps"][mask].double(),
                rtol=1e-6,
                atol=1e-6,
            )
        checked += int(mask.sum())
    assert checked == len(tokens)  # every recorded token was compared
    if mu > 1:  # later updates are off-policy: ratio != 1
        assert (tokens.ratio - 1).abs().max() > 1e-4


def test_grad_norms_samples_and_metrics_match_trl(tmp_path):
    trainer = make_trainer(tmp_path, "grpo", num_iterations=2, max_grad_norm=0.5)
    tg_trl.attach(trainer, tmp_path / "run")
    trainer.train()
    run = load_run(tmp_path / "run")
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]
    totals = run.layers[run.layers.layer == "total"].sort_values("update_id")
    # TRL logs the norm clip_grad_norm_ returned (before clipping); max_grad_norm=0.5 does clip here
    np.testing.assert_allclose(totals.grad_norm, [h["grad_norm"] for h in logged], rtol=1e-5)
    assert max(h["grad_norm"] for h in logged) > 0.5
    assert run.steps.n_updates.tolist() == [2]
    samples = run.samples
    assert samples.sample_id.tolist() == list(range(4))
    assert samples.group_id.tolist() == [0, 0, 0, 0]
    np.testing.assert_allclose(samples.reward, distinct_chars(samples.completion.tolist()))
    np.testing.assert_allclose(samples.reward_distinct_chars, samples.reward)
    # group-normalised advantages (TRL's scale_rewards="group"): zero mean within the group
    assert abs(samples.advantage.mean()) < 1e-6
    tokens = run.tokens(columns=["sample_id", "position", "pass_id"])
    lengths = tokens[tokens.pass_id == 0].groupby("sample_id").size()  # the second pass re-scores them
    assert lengths.tolist() == samples.length.tolist()
    assert run.steps.trl_global_step.tolist() == [2]  # the step's last update is TRL's step 2
    assert run.steps.reward_mean.iloc[0] == pytest.approx(samples.reward.mean(), rel=1e-6)


def tr_grpo_reference(lp):
    """TR-GRPO default weights from the formula, independently of tokengrad.objective.weighting:
    w = clip(2 (sigmoid(9 p) - 0.25), 1, 1.4); e.g. p = 0.2: 2 (0.858 - 0.25) = 1.216."""
    return (2.0 * (torch.sigmoid(9.0 * lp.exp()) - 0.25)).clamp(1.0, 1.4)


def test_tr_grpo_attach_scales_gradients_exactly_by_the_weights(tmp_path):
    # temperature 0.1 sharpens the tiny model so token probabilities span the weight's rising range
    trainer = make_trainer(tmp_path, "dapo", max_grad_norm=0.0, temperature=0.1)
    tg_trl.attach(trainer, tmp_path / "run", weighting="tr_grpo")
    passes = capture_passes(trainer, weights_fn=tr_grpo_reference)
    grads = []

    from transformers import TrainerCallback

    class GradSnapshot(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            grads.append([p.grad.clone() for p in trainer.model.parameters() if p.requires_grad])

    trainer.add_callback(GradSnapshot())
    trainer.train()
    tokens = load_run(tmp_path / "run").tokens()
    assert len(passes) == len(grads) == 2
    for step, (p, g) in enumerate(zip(passes, grads)):
        mask = p["inputs"]["completion_mask"].bool()
        rows = rows_of(tokens, step, 0)
        sid = p["inputs"][tg_trl.SAMPLE_KEY]
        w = as_matrix(rows, "weight", sid, mask.shape)
        torch.testing.assert_close(w[mask], p["w"][mask].double(), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(
            as_matrix(rows, "coef", sid, mask.shape)[mask],
            (p["w"] * p["coef"])[mask].double(),
            rtol=1e-5,
            atol=1e-9,
        )
        for got, want in zip(g, p["grad_weighted"]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert w[mask].min() < 1.2 and w[mask].max() > 1.2  # weights really differ between tokens
    diff = max(float((a - b).abs().max()) for a, b in zip(grads[-1], passes[-1]["grad_plain"]))
    assert diff > 1e-4  # ... so the gradient is not TRL's plain one
    meta = load_run(tmp_path / "run").meta["weighting"]
    assert meta["name"] == "tr_grpo" and meta["params"]["k"] == 9.0 and meta["applied_as"] == "grad_scale"


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("lopti", {}, "phases"),
        ("kl_cov", {}, "kl_cov_coef"),
        ("tr_grpo", {"placement": "ratio"}, "ratio_weight"),
    ],
)
def test_rules_that_are_not_a_gradient_scale_are_refused(name, params, field):
    with pytest.raises(ValueError) as err:
        tg_trl.resolve_weighting(name, params)
    msg = str(err.value)
    assert field in msg and "tr_grpo" in msg.split("rules that can:")[1]
    assert "lopti" not in msg.split("rules that can:")[1]


def test_supported_weightings_are_exactly_the_scale_rules():
    assert tg_trl.supported_weightings() == [
        "ar",
        "clip_cov",
        "cw_grpo",
        "grpo",
        "tr_grpo",
        "tr_grpo_reverse",
    ]
    with pytest.raises(ValueError, match="unknown weighting rule"):
        tg_trl.resolve_weighting("no_such_rule", {})


def test_version_outside_tested_range_is_refused():
    for good in ("1.13.0", "1.14.2", "1.15.0", "1.16.3"):
        tg_trl.check_trl_version(good)
    for bad in ("1.9.0", "1.12.0", "1.17.0.dev0", "2.0.0"):
        with pytest.raises(RuntimeError, match=r"tested with trl>=1\.13,<1\.17"):
            tg_trl.check_trl_version(bad)
    tg_trl.check_trl_version("1.17.0", allow_untested=True)


def test_liger_loss_path_and_double_attach_are_refused(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.args.use_liger_kernel = True
    trainer.compute_liger_loss = lambda *a, **k: None  # a TRL whose liger path bypasses _compute_loss
    with pytest.raises(ValueError, match="use_liger_kernel=True"):
        tg_trl.attach(trainer, tmp_path / "run")
    del trainer.compute_liger_loss
    trainer.args.use_liger_kernel = False
    tg_trl.attach(trainer, tmp_path / "run")
    with pytest.raises(ValueError, match="already attached"):
        tg_trl.attach(trainer, tmp_path / "run2")
    with pytest.raises(ValueError, match="records a trl.GRPOTrainer"):
        tg_trl.check_trainer(object())


def test_train_end_restores_the_trainer(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1)
    forward = vars(trainer.model).get("forward")  # TRL's fused head (TRL >= 1.15), else the class's
    tg_trl.attach(trainer, tmp_path / "run")
    assert "compute_loss" in vars(trainer)
    if FUSED_HEAD:  # attach re-adds the fused head to read sum_j p_j^2 as well
        assert vars(trainer.model)["forward"] is not forward
    trainer.train()
    # only the wrapper that continues the run on a later train() stays (doctor/test_doctor_conformance.py)
    assert "compute_loss" not in vars(trainer) and "clip_grad_norm_" not in vars(trainer.accelerator)
    assert vars(trainer.model).get("forward") is forward
    assert not trainer.model._forward_hooks  # the hooks reading the head's outputs are gone
    assert not any(type(cb).__module__.startswith("tokengrad.") for cb in trainer.callback_handler.callbacks)
    assert load_run(tmp_path / "run").meta["finished"] is True


@pytest.mark.parametrize("entropy_coef", [0.0, 0.5])
def test_bucket_analysis_inside_trl(tmp_path, entropy_coef):
    trainer = make_trainer(tmp_path, "dapo", max_steps=1, entropy_coef=entropy_coef, temperature=0.1)
    tg_trl.attach(trainer, tmp_path / "run", buckets=1)
    trainer.train()
    run = load_run(tmp_path / "run")
    b = run.buckets
    residual = float(b[b.bucket == "residual"].update_share.iloc[0])
    # the bucket gradients and the residual add up to the update that TRL applied
    assert b.update_share.sum() == pytest.approx(1.0, abs=1e-4)
    assert b.n_tokens.sum() == int(run.tokens(columns=["in_loss"]).in_loss.sum())
    if entropy_coef == 0.0:
        assert abs(residual) < 1e-5  # all of TRL's dapo loss reaches the parameters through log pi
    else:
        assert abs(residual) > 1e-3  # the entropy bonus does not: it is the residual


def test_failing_train_keeps_finished_steps_and_restores_the_trainer(tmp_path):
    calls = []

    def flaky(completions, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("reward server down")
        return distinct_chars(completions)

    trainer = make_trainer(tmp_path, reward_funcs=(flaky,))
    tg_trl.attach(trainer, tmp_path / "run")
    with pytest.raises(RuntimeError, match="reward server down"):
        trainer.train()
    run = load_run(tmp_path / "run")
    # step 0 finished before the failure; step 1 failed while scoring and is kept as far as it got: no tokens
    assert run.steps.step.tolist() == [0, 1]
    assert run.tokens(columns=["step"]).step.unique().tolist() == [0]
    assert "compute_loss" not in vars(trainer)
    status = json.loads((tmp_path / "run" / "ranks" / "rank000.json").read_text())
    assert run.meta["finished"] is False and status["finished"] is False  # a crashed run is not finished


def test_update_shares_inside_trl(tmp_path):
    trainer = make_trainer(tmp_path, "dapo", max_steps=1, temperature=0.1)
    tg_trl.attach(trainer, tmp_path / "run", attribution=1)
    trainer.train()
    run = load_run(tmp_path / "run")
    tok = run.tokens()
    # every token's share of the update TRL applied: they sum to 1 (dapo's loss is built on log pi alone)
    assert tok["update_share"].notna().all()
    assert tok.groupby("update_id")["update_share"].sum().tolist() == pytest.approx([1.0], abs=1e-3)
    assert tok["dlogprob"].notna().all() and tok["dlogprob_pred"].notna().all()
    trainer = make_trainer(tmp_path / "jvp", "dapo", max_steps=1, temperature=0.1)
    tg_trl.attach(trainer, tmp_path / "jvp" / "run", attribution=Attribution(every=1, method="jvp"))
    if FUSED_HEAD:  # TRL's fused LM head is an autograd.Function without a forward-mode derivative
        with pytest.raises(RuntimeError, match="central_difference"):
            trainer.train()
    else:  # a TRL that scores full logits differentiates forward: the same shares, by the exact JVP
        trainer.train()
        jvp = load_run(tmp_path / "jvp" / "run").tokens()
        assert jvp.groupby("update_id")["update_share"].sum().tolist() == pytest.approx([1.0], abs=1e-3)
