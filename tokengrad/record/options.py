"""The Recorder's option groups: what a run is called (`RunInfo`), the probability-bucket analysis
(`Buckets`), per-token attribution of the update (`Attribution`), where rows go (`Output`); the token budget
is `tokengrad.record.budget.kept_rows.Budget`. Each group also takes a plain number where that says enough:
`Recorder(dir, buckets=10, attribution=5, budget=65536)`.

The flat keywords of earlier releases (`bucket_every=`, `attribute_every=`, `token_budget=`, ...) are
refused with the grouped form that replaced them (`refuse_flat_keywords`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tokengrad import schema
from tokengrad.record.attribution.shares import ATTRIBUTION_METHODS
from tokengrad.record.buckets.analysis import validate_edges
from tokengrad.record.budget.kept_rows import Budget
from tokengrad.record.checks import every_steps

ON_ERROR = ("count", "raise")


@dataclass(frozen=True)
class RunInfo:
    """Labels of the run in meta.json: its name (default: the directory's), the model's name (default: the
    model class), the token-weighting rule ({"name", "params", "curve"}), and the temperature T the recorded
    log-probs divide the logits by (the sampler's)."""

    name: str | None = None
    model_name: str | None = None
    weighting: dict | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class Buckets:
    """The probability-bucket analysis (AR-Lopti arXiv 2505.12929 Fig. 1): every `every` steps (0 = never;
    one extra backward per bucket), over the probability intervals `edges`."""

    every: int = 0
    edges: tuple = schema.DEFAULT_BUCKET_EDGES

    def __post_init__(self):
        object.__setattr__(self, "every", every_steps("buckets.every", self.every))
        object.__setattr__(self, "edges", tuple(validate_edges(self.edges)))


@dataclass(frozen=True)
class Attribution:
    """Each token's exact share of the update (`update_share`) and the applied update's dlogprob_pred /
    dlogprob, every `every` steps (0 = never); passes must be tracked with `recompute=`. `method`: a name
    of record.attribution.ATTRIBUTION_METHODS ("jvp" exact, "central_difference" for models without
    forward-mode AD), `eps` its step (None: automatic); `applied`: also attribute the update the optimizer
    applied (one parameter-sized copy); `entropy`: also each token's share of the change of the mean token
    entropy (`entropy_share`), `dentropy_pred` / `dentropy` and the step's entropy change and Cov(log pi, A)
    (record/attribution/entropy.py: one more backward and one more directional pass per update;
    `recompute()` must then return the pair (log-probs, entropy)). `on_spike`: also attribute a step whose
    pre-clip gradient norm is a spike by the doctor's rule (robust z > 3.5 against the steps so far, read in
    `record_grad_norms` before the optimizer step) and replay it without its top-1/5/20 culprit tokens
    (steps.grad_norm_without_top{k} and spike_z; record/attribution/spike_replay.py)."""

    every: int = 0
    method: str = "jvp"
    eps: float | None = None
    applied: bool = True
    entropy: bool = False
    on_spike: bool = False

    def __post_init__(self):
        object.__setattr__(self, "every", every_steps("attribution.every", self.every))
        for name in ("entropy", "on_spike"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"attribution.{name} must be True or False, got {getattr(self, name)!r}")
        ATTRIBUTION_METHODS[self.method]  # an unknown name raises ValueError listing the known ones


@dataclass(frozen=True)
class Output:
    """Where rows go. `on_error`: "count" (a writer failure drops and counts rows, training goes on) or
    "raise" (each step waits for its commit and raises at the end of the step that lost rows);
    `compact_every`: merge small per-step files after this many steps; `trackers`:
    `tokengrad.integrations.trackers` backends that get each step's aggregates live (rank 0 only);
    `upload_wait`: seconds `Recorder.close` waits for a run in a bucket to finish uploading (what is still
    local then stays in the staging folder and is named, docs/buckets.md)."""

    on_error: str = "count"
    compact_every: int = 64
    trackers: tuple = field(default_factory=tuple)
    upload_wait: float = 60.0

    def __post_init__(self):
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        if every_steps("compact_every", self.compact_every) < 1:
            raise ValueError(f"compact_every must be >= 1, got {self.compact_every}")
        if not self.upload_wait >= 0:  # also refuses nan
            raise ValueError(f"upload_wait must be a number of seconds >= 0, got {self.upload_wait!r}")
        object.__setattr__(self, "trackers", tuple(self.trackers))


@dataclass(frozen=True)
class Doctor:
    """Live diagnosis (tokengrad.doctor.live): the detectors run on committed steps on a thread of their
    own; each new finding of severity `alert_on` or worse and confidence >= `min_confidence` goes to the
    trackers (`Tracker.alert`: W&B alert, TensorBoard text) and to `on_finding(finding)`. With `halt`, a
    critical finding makes the next step boundary (`begin_step`) raise `DoctorHalt`. `detectors`: names
    (None = all). `detector_timeout`: seconds one detector may take on one diagnosis before it is named
    in a warning and skipped until it returns (the slowest built-in took 0.54 s on the largest shipped
    run, docs/doctor.md); `close_timeout`: seconds `Recorder.close` waits for the last diagnosis."""

    halt: bool = False
    on_finding: Callable | None = None
    min_confidence: float = 0.9
    alert_on: str = "warning"
    detectors: tuple | None = None
    detector_timeout: float = 30.0
    close_timeout: float = 5.0

    def __post_init__(self):
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {self.min_confidence!r}")
        if self.alert_on not in ("info", "warning", "critical"):
            raise ValueError(f"alert_on must be info, warning or critical, got {self.alert_on!r}")
        if self.on_finding is not None and not callable(self.on_finding):
            raise ValueError(f"on_finding must be callable, got {type(self.on_finding).__name__}")
        if self.detectors is not None:
            object.__setattr__(self, "detectors", tuple(self.detectors))
        for name in ("detector_timeout", "close_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


class DoctorHalt(RuntimeError):
    """Raised at a step boundary (Recorder.begin_step) after the live doctor found a critical finding
    with `Doctor(halt=True)`; `.finding` is it. The step that showed it is recorded; catch it to stop the
    loop cleanly (the built-in trainer saves a checkpoint, the TRL attach sets should_training_stop)."""

    def __init__(self, finding):
        self.finding = finding
        super().__init__(
            f"tokengrad doctor halted the run: {finding.id} ({finding.severity}): {finding.message}"
        )


def as_doctor(value) -> Doctor | None:
    """Doctor(...) as given, True -> Doctor(), False/None -> off."""
    if value is None or value is False:
        return None
    if value is True:
        return Doctor()
    if not isinstance(value, Doctor):
        raise ValueError(f"doctor must be True, False or Doctor(...), got {type(value).__name__}")
    return value


def as_buckets(value) -> Buckets:
    return value if isinstance(value, Buckets) else Buckets(every=0 if value is None else value)


def as_attribution(value) -> Attribution:
    return value if isinstance(value, Attribution) else Attribution(every=0 if value is None else value)


def as_budget(value) -> Budget | None:
    if value is None or isinstance(value, Budget):
        return value
    return Budget(value)


# The flat keywords of the first releases -> (group keyword, field of that group); refused, with the form
# that replaced them.
FLAT_KEYWORDS = {
    "run_name": ("info", "name"),
    "model_name": ("info", "model_name"),
    "weighting": ("info", "weighting"),
    "temperature": ("info", "temperature"),
    "bucket_every": ("buckets", "every"),
    "bucket_edges": ("buckets", "edges"),
    "attribute_every": ("attribution", "every"),
    "attribute_method": ("attribution", "method"),
    "attribute_eps": ("attribution", "eps"),
    "attribute_applied": ("attribution", "applied"),
    "token_budget": ("budget", None),
    "on_error": ("output", "on_error"),
    "compact_every": ("output", "compact_every"),
    "trackers": ("output", "trackers"),
}
GROUPS = {"info": RunInfo, "buckets": Buckets, "attribution": Attribution, "output": Output}


def refuse_flat_keywords(kwargs: dict, caller: str = "Recorder") -> None:
    """A one-line TypeError for the first flat keyword of an earlier release in `kwargs`, naming the
    grouped form that replaced it; nothing when there is none."""
    for key, value in kwargs.items():
        if key in FLAT_KEYWORDS:
            group, attr = FLAT_KEYWORDS[key]
            new = f"{value!r}" if attr is None else f"{GROUPS[group].__name__}({attr}={value!r})"
            raise TypeError(f"{caller}({key}=...) was removed: write {caller}({group}={new})")
