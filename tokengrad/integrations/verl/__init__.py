"""verl: tokengrad's policy losses for verl's registry (`losses`), recording every loss call, and the
plugin entry point verl loads at `import verl` (`plugin`). docs/verl.md has the set-up."""

from tokengrad.integrations.verl.losses import (
    BUDGET_ENV,
    DEFAULT_RUN_DIR,
    LOSS_PREFIX,
    RUN_DIR_ENV,
    TESTED_VERL,
    VerlRecording,
    check_verl_version,
    close_recording,
    loss_name,
    make_policy_loss,
    recording,
    register_losses,
)

__all__ = [
    "BUDGET_ENV",
    "DEFAULT_RUN_DIR",
    "LOSS_PREFIX",
    "RUN_DIR_ENV",
    "TESTED_VERL",
    "VerlRecording",
    "check_verl_version",
    "close_recording",
    "loss_name",
    "make_policy_loss",
    "recording",
    "register_losses",
]
