"""verl: tokengrad's policy losses for verl's registry (`losses`), recording every loss call, the rollout
engine's side of each update (`rollout`), the bypass-mode mismatch probe (`probe`), the options
(`options`) and the plugin entry point verl loads at `import verl` (`plugin`). docs/verl.md has the set-up."""

from tokengrad.integrations.verl.losses import (
    LOSS_PREFIX,
    TESTED_VERL,
    VerlRecording,
    check_verl_version,
    close_recording,
    loss_name,
    make_policy_loss,
    recording,
    register_losses,
)
from tokengrad.integrations.verl.options import (
    BUDGET_ENV,
    DEFAULT_RUN_DIR,
    PROBE_ENV,
    RUN_DIR_ENV,
    VerlOptions,
)

__all__ = [
    "BUDGET_ENV",
    "DEFAULT_RUN_DIR",
    "LOSS_PREFIX",
    "PROBE_ENV",
    "RUN_DIR_ENV",
    "TESTED_VERL",
    "VerlOptions",
    "VerlRecording",
    "check_verl_version",
    "close_recording",
    "loss_name",
    "make_policy_loss",
    "recording",
    "register_losses",
]
