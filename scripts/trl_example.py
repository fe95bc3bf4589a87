"""Record a TRL GRPOTrainer run with tokengrad: two added lines, the trainer stays TRL's.

    python scripts/trl_example.py                                             # CPU, tiny model, runs/trl_demo
    python scripts/trl_example.py --run-dir runs/trl_tr --weighting tr_grpo     # TR-GRPO weights inside TRL
    torchrun --nproc_per_node 2 scripts/trl_example.py --run-dir runs/trl_ddp   # 2 processes (gloo on CPU)
    tokengrad dashboard runs/                                                   # look at the runs

Offline: the model is tokengrad's tiny random Llama and the tokenizer is built locally, so the numbers
mean nothing but every code path of a real run is exercised. With a real model, pass its path to
GRPOTrainer and drop `use_cpu`.
"""

from __future__ import annotations

import argparse
import warnings

PROMPTS = ["Count to five:", "Name a colour:", "2 + 2 =", "Say hello:"]


def distinct_characters(completions, **kwargs) -> list[float]:
    """Toy reward: share of distinct characters in the completion (varies within every group)."""
    return [len(set(c)) / max(len(c), 1) for c in completions]


def main(
    run_dir: str,
    weighting: str | None = None,
    loss_type: str = "dapo",
    steps: int = 4,
    logging_steps: int = 10,
) -> None:
    # imported here, after the arguments are read, so that --help answers without loading torch and trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from tokengrad.integrations.trl import attach
    from tokengrad.train.models import make_tiny_model, make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    args = GRPOConfig(
        output_dir=f"{run_dir}/trl_output",
        loss_type=loss_type,
        max_steps=steps,
        logging_steps=logging_steps,  # TRL's default; the attach records every step whatever it is
        learning_rate=1e-2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=12,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trainer = GRPOTrainer(
            model=make_tiny_model(tok),
            reward_funcs=[distinct_characters],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": PROMPTS * 8}),
            processing_class=tok,
        )
    attach(trainer, run_dir, weighting=weighting)  # the two added lines: import + attach
    trainer.train()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", default="runs/trl_demo", help="the run folder")
    ap.add_argument("--weighting", default=None, help="a rule of tokengrad.objective.weighting, e.g. tr_grpo")
    ap.add_argument("--loss-type", default="dapo", help="TRL's loss_type: grpo, dapo, dr_grpo, bnpo, ...")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--logging-steps", type=int, default=10, help="TRL's logging_steps (its default: 10)")
    a = ap.parse_args()
    main(a.run_dir, a.weighting, a.loss_type, a.steps, a.logging_steps)
