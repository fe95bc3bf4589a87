"""The doctor's conformance table: each pathology and the finding every producer must get for it.

tests/doctor/test_doctor_conformance.py makes each case through the built-in trainer, the TRL attach and a
plain Recorder loop; tests/integrations/verl/test_verl_conformance.py through the verl plugin (in .venv-verl).
Both read this one table, so a producer cannot pass with its own expectation. Plain Python: no torch,
no trl, no verl.
"""

from __future__ import annotations

N_STEPS = 24  # dead steps and constant rewards turn critical after 20 steps in a row
G, PROMPTS, LIMIT = 4, 2, 8  # completions per prompt, prompts per step, the length limit in tokens

# case -> (finding id, severity), the same from every producer that can make the case
EXPECTED = {
    "truncation": ("truncation", "critical"),
    "nan_loss": ("nonfinite", "critical"),
    "nan_reward": ("reward_nonfinite", "critical"),
    "dead_steps": ("dead_steps", "critical"),
    "constant_reward": ("reward_std_death", "critical"),
    "entropy_collapse": ("entropy_collapse", "critical"),
    "clip_saturation": ("clip_saturation", "critical"),
}
CASES = list(EXPECTED)


def expected(case: str) -> tuple[str, str]:
    return EXPECTED[case]
