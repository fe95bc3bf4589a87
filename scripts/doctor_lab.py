"""The doctor on real lab runs (the lab organism: configs/lab_add_grpo.toml, model `lab-add`, CPU).

    python scripts/doctor_lab.py cases --out /tmp/doctor_lab            # pathological runs, each diagnosed
    python scripts/doctor_lab.py cases --only lr_spike --out /tmp/dl    # one of them
    python scripts/doctor_lab.py healthy --seeds 20 --steps 40 --out /tmp/doctor_healthy   # false positives

`cases` trains each pathological run (a learning rate that spikes for one step, a learning rate large
enough to collapse the entropy, a KL-penalised run whose KL blows up) and prints the finding its detector
made, the onset against the step the pathology began, and every warning or critical finding of the run.
`healthy` trains the unchanged lab config for `--seeds` seeds of `--steps` steps and prints, per detector,
the share of runs with a warning or critical finding (the false-positive rate of the healthy lab) and the
share with a critical one. Runs go under --out (outside the repository); a finished run there is reused.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from tokengrad.doctor import diagnose  # noqa: E402
from tokengrad.doctor.engine import load_detectors  # noqa: E402
from tokengrad.doctor.registry import DETECTORS  # noqa: E402
from tokengrad.read import load_run  # noqa: E402
from tokengrad.train.config import load_config  # noqa: E402
from tokengrad.train.trainer import Trainer  # noqa: E402

CONFIG = ROOT / "configs" / "lab_add_grpo.toml"
# short runs: no held-out evaluation (it would dominate the wall time), no checkpoint, no progress bar
SHORT = dict(eval_every=0, eval_at_start=False, checkpoint=False, progress=False)


class SpikedLR(Trainer):
    """The lab trainer with its learning rate multiplied by `factor` for `span` steps from step `at` (the
    optimizer's own state is untouched: a scheduler bug or a mistyped warm-up looks like this)."""

    def __init__(self, cfg, at: int, factor: float, span: int = 1):
        super().__init__(cfg)
        self.at, self.factor, self.span = at, factor, span

    def set_lr(self, step: int) -> float:
        lr = super().set_lr(step)
        if self.at <= step < self.at + self.span:
            lr *= self.factor
            for group in self.opt.param_groups:
                group["lr"] = lr
        return lr


# name -> (config overrides, (spike step, factor) or None, detector expected, step the pathology begins)
CASES = {
    "lr_spike": (dict(steps=40, attribute_on_spike=True), (20, 300.0), "gradient_spike", 21),
    "entropy_collapse": (dict(steps=60, lr=2e-3), None, "entropy_collapse", 0),
    "kl_blowup": (dict(steps=40, lr=1e-3, beta=0.04), None, "kl_blowup", 0),
}


def train(run_dir: Path, overrides: dict, spike=None) -> tuple[Path, float]:
    """Train (or reuse) one run; returns its directory and the wall seconds of training (0 if reused)."""
    if (run_dir / "meta.json").exists() and load_run(run_dir).meta.get("finished"):
        return run_dir, 0.0
    cfg = load_config(CONFIG, {**SHORT, **overrides, "run_dir": str(run_dir)})
    t = time.perf_counter()
    trainer = SpikedLR(cfg, *spike) if spike else Trainer(cfg)
    trainer.setup().train()
    return run_dir, time.perf_counter() - t


def cases(out: Path, only: list[str] | None, seed: int) -> None:
    for name, (overrides, spike, want, onset) in CASES.items():
        if only and name not in only:
            continue
        run_dir, secs = train(out / name, {**overrides, "seed": seed}, spike)
        found = diagnose(run_dir)
        hit = [f for f in found if f.id == want]
        print(f"== {name}: {run_dir} ({secs:.0f} s)")
        if hit:
            f = hit[0]
            print(f"  {want}: {f.severity}, first step {f.first_step} (from step {onset}): {f.message}")
        else:
            print(f"  {want}: NOT FOUND")
        for f in found:
            if f.at_least("warning") and f is not (hit[0] if hit else None):
                print(f"  also {f.severity} {f.id} (step {f.first_step}): {f.message}")


def healthy(out: Path, seeds: list[int], steps: int) -> None:
    load_detectors()
    loud, critical, runs = Counter(), Counter(), 0
    t0 = time.perf_counter()
    for seed in seeds:
        run_dir, secs = train(out / f"healthy-s{seed}", {"seed": seed, "steps": steps})
        found = diagnose(run_dir)
        runs += 1
        loud.update({f.id for f in found if f.at_least("warning")})
        critical.update({f.id for f in found if f.at_least("critical")})
        said = ", ".join(sorted(f"{f.id}:{f.severity}" for f in found if f.at_least("warning"))) or "-"
        print(f"seed {seed}: {secs:.0f} s; {said}", flush=True)
    print(f"\n{runs} healthy lab runs of {steps} steps ({time.perf_counter() - t0:.0f} s)")
    print(f"{'detector':24s} {'warning+':>9s} {'rate':>6s} {'critical':>9s} {'rate':>6s}")
    for name in sorted(DETECTORS):
        print(
            f"{name:24s} {loud[name]:9d} {loud[name] / runs:6.2f} {critical[name]:9d} "
            f"{critical[name] / runs:6.2f}"
        )
    any_loud = sum(1 for _ in loud.elements())
    print(f"findings of warning or worse per run: {any_loud / runs:.2f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["cases", "healthy"])
    ap.add_argument("--out", type=Path, required=True, help="folder for the runs (outside the repository)")
    ap.add_argument("--only", nargs="*", help="cases: these only")
    ap.add_argument("--seed", type=int, default=0, help="cases: the seed")
    ap.add_argument("--seeds", type=int, default=20, help="healthy: seeds 0..N-1")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=40, help="healthy: steps per run")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.what == "cases":
        cases(a.out, a.only, a.seed)
    else:
        healthy(a.out, list(range(a.first_seed, a.first_seed + a.seeds)), a.steps)


if __name__ == "__main__":
    main()
