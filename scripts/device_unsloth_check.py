"""GPU check of the TRL integration under Unsloth (docs/api.md, "Refused"): not run yet, so unverified.

Needs a CUDA GPU, `pip install unsloth` (it pins its own trl, at most 1.15 as of unsloth 2026.10.9) and
SmolLM2-135M-Instruct (hub id or a local directory: --model). About 3 minutes on one H100 (an estimate); a
watchdog stops it at --limit seconds (default 570). Writes its findings as JSON (--out, default $OUT or
artifacts/) and prints one line per check; exits 1 when attach() does not refuse (the probe's findings are
facts either way).

What it runs: Unsloth's GRPO trainer on SmolLM2-135M (LoRA, bf16), 4 optimizer steps, one micro-batch each.
1. `tokengrad.integrations.trl.attach` must refuse the real Unsloth class in one line naming its markers.
2. Then, for the facts an exact recording by wrapping Unsloth's `UnslothEfficientGRPO` global would rest on,
   the generated module's global is replaced by a subclass that notes every `apply` call (argument shapes,
   the scaler, how many calls per compute_loss) and keeps its first argument `new_logprobs`. After each
   compute_loss, autograd of Unsloth's returned loss with respect to `new_logprobs` (the reference coef) is
   compared with the gradient that reaches `new_logprobs` in the trainer's own backward (a tensor hook).
   Equal (max relative difference < 1e-3), with `new_logprobs` shaped like TRL's completion_ids, means a
   hook there records coef exactly; any other ratio is the scale a wrapper would have to divide out.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--limit", type=int, default=570, help="watchdog, seconds")
    ap.add_argument("--out", default=os.environ.get("OUT") or "artifacts")
    return ap.parse_args()


def build_trainer(model_name: str, steps: int, workdir: str):
    """Unsloth's patched GRPOTrainer (unsloth is imported first, as it requires) on a tiny arithmetic set."""
    import unsloth  # noqa: F401  (patches trl on import)
    from unsloth import FastLanguageModel

    if hasattr(unsloth, "PatchFastRL"):  # older releases patch trl on request
        unsloth.PatchFastRL("GRPO", FastLanguageModel)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok = FastLanguageModel.from_pretrained(model_name, max_seq_length=256, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    pairs = [(a, b) for a in range(1, 9) for b in range(1, 5)]
    prompts = [f"What is {a} + {b}? Answer with the number only." for a, b in pairs]
    answers = {p: str(a + b) for p, (a, b) in zip(prompts, pairs)}

    def correct(prompts, completions, **kwargs):
        return [float(answers.get(p, "?") in str(c)) for p, c in zip(prompts, completions)]

    args = GRPOConfig(
        output_dir=workdir,
        max_steps=steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_generations=4,
        max_completion_length=24,
        learning_rate=5e-5,
        logging_steps=1,
        report_to="none",
        bf16=True,
        save_strategy="no",
        use_vllm=False,
        seed=0,
    )
    data = Dataset.from_dict({"prompt": prompts})
    return GRPOTrainer(
        model=model, processing_class=tok, reward_funcs=[correct], args=args, train_dataset=data
    )


def check_refusal(trainer, workdir: str) -> dict:
    from tokengrad.integrations.trl import attach
    from tokengrad.integrations.trl.unsloth import unsloth_markers

    markers = unsloth_markers(trainer)
    try:
        attach(trainer, Path(workdir) / "run")
    except ValueError as err:
        msg = str(err)
        ok = msg.startswith("attach() cannot record Unsloth's GRPO trainer") and "\n" not in msg
        return dict(markers=markers, refused=ok, message=msg)
    return dict(markers=markers, refused=False, message="attach() accepted the Unsloth trainer")


def loss_module(trainer):
    """The generated module whose globals hold UnslothEfficientGRPO (the trainer class's, or a base's)."""
    for cls in type(trainer).__mro__:
        mod = sys.modules.get(cls.__module__)
        if mod is not None and hasattr(mod, "UnslothEfficientGRPO"):
            return mod
    raise RuntimeError(f"no UnslothEfficientGRPO global in the modules of {type(trainer).__mro__}")


def install_probe(trainer, findings: dict):
    """Note every UnslothEfficientGRPO.apply call; per micro-batch, the hook's gradient against autograd."""
    import torch

    mod = loss_module(trainer)
    base = mod.UnslothEfficientGRPO
    seen: list = []  # new_logprobs tensors of the current compute_loss

    class Probe(base):
        @classmethod
        def apply(cls, *args):
            shapes = [tuple(a.shape) if torch.is_tensor(a) else type(a).__name__ for a in args]
            findings["apply_calls"].append(
                dict(shapes=shapes, scaler=repr(args[9]) if len(args) > 9 else None)
            )
            if torch.is_tensor(args[0]) and args[0].requires_grad:
                seen.append(args[0])
            return base.apply(*args)

    mod.UnslothEfficientGRPO = Probe
    inner = trainer.compute_loss

    def compute_loss(model, inputs, *a, **k):
        seen.clear()
        loss = inner(model, inputs, *a, **k)
        if not (torch.is_grad_enabled() and model.training and seen):
            return loss
        refs = torch.autograd.grad(loss, list(seen), retain_graph=True, allow_unused=True)
        entry = dict(completion_ids=tuple(inputs["completion_ids"].shape), calls=len(seen), compared=[])
        findings["micro_batches"].append(entry)
        for lp, ref in zip(list(seen), refs):
            lp.register_hook(lambda g, ref=ref: entry["compared"].append(compare(g, ref)))
        return loss

    trainer.compute_loss = compute_loss


def compare(hook_grad, ref) -> dict:
    """The hook's gradient against autograd's: the largest relative difference and their median ratio."""

    if ref is None:
        return dict(reference="unused: the loss does not depend on new_logprobs through autograd")
    g, r = hook_grad.detach().double(), ref.detach().double()
    nz = r.abs() > 1e-12
    rel = float(((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item())
    ratio = float((g[nz] / r[nz]).median().item()) if bool(nz.any()) else float("nan")
    return dict(shape=tuple(g.shape), max_rel_diff=rel, median_ratio=ratio, exact=rel < 1e-3)


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGALRM, lambda *_: sys.exit(f"device_unsloth_check: over {args.limit} s, stopped"))
    signal.alarm(args.limit)
    findings: dict = dict(apply_calls=[], micro_batches=[])
    with tempfile.TemporaryDirectory() as workdir:
        trainer = build_trainer(args.model, args.steps, workdir)
        import trl
        import unsloth

        findings.update(versions=dict(unsloth=unsloth.__version__, trl=trl.__version__))
        findings["refusal"] = check_refusal(trainer, workdir)
        install_probe(trainer, findings)
        trainer.train()
    compared = [c for m in findings["micro_batches"] for c in m["compared"]]
    aligned = all(
        m["completion_ids"] == c.get("shape") for m in findings["micro_batches"] for c in m["compared"]
    )
    checks = {
        "attach refuses the Unsloth trainer": findings["refusal"]["refused"],
        "UnslothEfficientGRPO.apply was called": bool(findings["apply_calls"]),
        "hook gradient equals autograd of Unsloth's loss": bool(compared)
        and all(c.get("exact") for c in compared),
        "new_logprobs shaped like completion_ids": bool(compared) and aligned,
    }
    findings["checks"] = checks
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "device_unsloth_check.json").write_text(json.dumps(findings, indent=1, default=str))
    for name, ok in checks.items():
        print(f"[{'ok' if ok else 'FAIL'}] {name}")
    print(f"findings: {out / 'device_unsloth_check.json'}")
    return 0 if checks["attach refuses the Unsloth trainer"] else 1


if __name__ == "__main__":
    sys.exit(main())
