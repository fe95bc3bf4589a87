"""The TRL attach on a matrix of GRPOConfig options as TRL's own tests combine them, each case otherwise on
TRL's defaults (logging_steps=10, learning_rate=1e-6, save_strategy, ...; only TINY's sizes and the CPU are
set): every generation batch is a recorded step, every optimizer update has its gradient norm, every step
its loss and rewards, and every recorded coef is autograd of TRL's own loss recomputed on the same inputs.

Three cases run in the default tier; the rest of the matrix is `slow` (scripts/test.sh's second tier, and
the oldest-TRL stage)."""

import math

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl")

from test_trl import (  # noqa: E402
    as_matrix,
    capture_passes,
    completion_text,
    distinct_chars,
    make_trainer,
    rows_of,
)

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import trl as tg_trl  # noqa: E402

pytestmark = pytest.mark.trl


def short(completions, **kwargs):
    """A second reward with its own spread: shorter completions score higher."""
    return [1.0 - len(completion_text(c)) / 32 for c in completions]


def eval_set():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": ["abc", "what?"] * 2})


# case -> make_trainer keywords; loss_type "dapo" is TRL's default
CASES = {
    "grpo": dict(loss_type="grpo"),
    "bnpo": dict(loss_type="bnpo", num_iterations=2),
    "dr_grpo": dict(loss_type="dr_grpo", num_iterations=2),
    "dapo": dict(loss_type="dapo"),
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence", num_iterations=2),
    "cispo": dict(loss_type="cispo", num_iterations=2),
    "sapo": dict(loss_type="sapo", num_iterations=2),
    "vespo": dict(loss_type="vespo", num_iterations=2),
    "beta_ref_model": dict(beta=0.04),
    "num_iterations": dict(num_iterations=2),
    "steps_per_generation": dict(steps_per_generation=2),
    "grad_accumulation": dict(gradient_accumulation_steps=2),
    "accumulation_over_generations": dict(gradient_accumulation_steps=2, steps_per_generation=1),
    "eval_during_training": dict(eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4),
    "mask_truncated": dict(mask_truncated_completions=True),
    "scale_rewards_batch": dict(scale_rewards="batch"),
    "scale_rewards_none": dict(scale_rewards="none"),
    "top_entropy_quantile": dict(top_entropy_quantile=0.5),
    "entropy_bonus": dict(entropy_coef=0.1),
    "weighted_rewards": dict(reward_funcs=(distinct_chars, short), reward_weights=[1.0, 0.5]),
    "normalize_then_sum": dict(
        reward_funcs=(distinct_chars, short), multi_objective_aggregation="normalize_then_sum"
    ),
    "conversational": dict(conversational=True),
    "max_grad_norm_clips": dict(max_grad_norm=1e-3),
    "max_grad_norm_off": dict(max_grad_norm=0.0),
    "sequence_level_grpo": dict(loss_type="grpo", importance_sampling_level="sequence", num_iterations=2),
    "peft_lora": dict(peft=True),
}
FAST = ("dapo", "weighted_rewards", "conversational")  # a few seconds each


def build(tmp_path, case: str):
    opts = dict(CASES[case])
    if case == "eval_during_training":
        opts["trainer_kwargs"] = {"eval_dataset": eval_set()}
    if opts.pop("peft", False):
        peft = pytest.importorskip("peft")
        lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        opts["trainer_kwargs"] = {"peft_config": lora}
    return make_trainer(tmp_path, trl_defaults=True, **opts)


def check_recorded(trainer, run, passes) -> None:
    """Every generation batch a step with its loss and rewards, every update its norm, every coef TRL's."""
    args, mu = trainer.args, trainer.num_iterations
    per_step = args.steps_per_generation * mu  # micro-batches per generation batch
    n_updates = args.max_steps
    assert len(passes) == n_updates * args.gradient_accumulation_steps
    steps = run.steps
    assert steps.step.tolist() == list(range(math.ceil(len(passes) / per_step)))
    totals = run.layers[run.layers.layer == "total"]
    assert len(totals) == n_updates and np.isfinite(totals.grad_norm).all()
    assert np.isfinite(steps.reward_mean).all() and steps.reward_std.notna().all()
    for name in trainer.reward_func_names:
        assert np.isfinite(steps[f"reward_{name}_mean"]).all()
    ended = steps[steps.trl_global_step.notna()]  # the steps where an update ended
    assert ended.trl_global_step.max() == n_updates and np.isfinite(ended.loss).all()
    assert np.isfinite(ended.lr).all()
    tokens = run.tokens()
    checked = 0
    for k, p in enumerate(passes):
        step, pass_id = divmod(k, per_step)
        mask = p["inputs"]["completion_mask"].bool()
        rows = rows_of(tokens, step, pass_id)
        assert len(rows) == int(mask.sum())
        sid = p["inputs"][tg_trl.SAMPLE_KEY]
        coef = as_matrix(rows, "coef", sid, mask.shape)
        torch.testing.assert_close(coef[mask], p["coef"][mask].double(), rtol=1e-5, atol=1e-9)
        checked += len(rows)
    assert checked == len(tokens)


@pytest.mark.parametrize("case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_attach_records_every_step_and_trls_own_coef(tmp_path, case):
    trainer = build(tmp_path, case)
    tg_trl.attach(trainer, tmp_path / "run")
    passes = capture_passes(trainer)
    trainer.train()
    run = load_run(tmp_path / "run")
    check_recorded(trainer, run, passes)
    assert run.meta["finished"] is True
    if case == "eval_during_training":  # evaluation ran, and its batches are not steps
        assert any("eval_loss" in h for h in trainer.state.log_history)
    if case == "max_grad_norm_clips":  # the norms are the ones before clipping: well above the clip
        assert run.layers[run.layers.layer == "total"].grad_norm.min() > 1e-2
    if case == "peft_lora":  # LoRA's adapters are what trains
        trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trained and all("lora_" in n for n in trained)
    if case == "mask_truncated":  # TRL zeroes a truncated completion's mask: it has no token rows
        limit = trainer.args.max_completion_length
        samples, tokens = run.samples, run.tokens(columns=["sample_id", "step"])
        truncated = samples[samples.length >= limit]
        assert len(truncated) and not set(zip(truncated.step, truncated.sample_id)) & set(
            zip(tokens.step, tokens.sample_id)
        )
