"""Recording: per-token statistics, the exact loss coefficient, gradient norms and bucket analysis, written
into the run format (`tokengrad.schema`). Needs torch; never imports the trainer, the figures or the app.

    from tokengrad.record import Recorder, logprobs_with_stats, token_stats
"""

from tokengrad.record.buckets.whatif import WhatIf
from tokengrad.record.budget.kept_rows import Budget
from tokengrad.record.fused_logprobs import logprobs_with_stats
from tokengrad.record.options import Attribution, Buckets, Doctor, DoctorHalt, Output, RunInfo
from tokengrad.record.recorder import Recorder
from tokengrad.record.stats import TokenStats, token_stats
from tokengrad.record.step_recorder import StepRecorder

__all__ = [
    "Attribution",
    "Budget",
    "Buckets",
    "Doctor",
    "DoctorHalt",
    "Output",
    "Recorder",
    "RunInfo",
    "StepRecorder",
    "TokenStats",
    "WhatIf",
    "logprobs_with_stats",
    "token_stats",
]
