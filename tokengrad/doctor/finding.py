"""What a detector reports: a `Finding`, with its evidence, the tokens and samples behind it, and actions.

    Finding(id="gradient_spike", severity="critical", confidence=0.99, first_step=142, last_step=142,
            message="step 142: grad_norm 9.1 = robust z 14 over the median 1.2; 3 tokens of sample 17 ...",
            evidence={"statistic": "modified z-score ...", "values": {...}, "thresholds": {...}},
            tokens=(TokenEvidence(step=142, sample_id=17, position=4, token_id=9, text=" 5", share=0.71,
                                  share_of="update", exact=True, prob=0.002),),
            actions=(Action("lower the learning rate or clip harder", "arXiv 2505.12929 Sec. 4"),))

A finding is plain data (frozen dataclasses, JSON through `as_dict`); `rank_findings` orders them critical
first, then by confidence and onset. A detector that cannot run on a run raises `NotChecked(reason)`; the
engine reports it next to the findings ("truncation: not checked, the length limit is unknown").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

SEVERITIES = ("info", "warning", "critical")  # ascending
# what each token-evidence share is a share of, and whether that share is exact
SHARE_OF = {
    "update": "exact share of the update's gradient, <g_token, g> / |g|^2 (attribution step; a step's "
    "updates pooled by |g_u|^2)",
    "bucket_update": "exact share of the update of the token's probability bucket (bucket-analysis step)",
    "logit_grad_norm": "estimate: share of the step's summed logit-gradient norms (alignment ignored)",
    "count": "share of the step's loss tokens",
}


# share_of kinds whose exactness is fixed by how they are computed (a count is exact, or an estimate where
# the detector says so: a completion's end judged by its length alone)
EXACT_SHARE = {"update": True, "bucket_update": True, "logit_grad_norm": False}


def share_note(tokens) -> str:
    """The footnote on a finding's token shares (TokenEvidence or their as_dict), from how each was computed:
    '' when no token carries a share; each kind of share once, in the order first listed."""
    notes: list[str] = []
    for t in tokens:
        get = t.get if isinstance(t, dict) else lambda k, t=t: getattr(t, k)
        if get("share") is None:
            continue
        kind = get("share_of")
        if kind in EXACT_SHARE:
            note = SHARE_OF[kind]
        else:
            note = f"{'exact' if get('exact') else 'estimate'}: {SHARE_OF[kind]}"
        if note not in notes:
            notes.append(note)
    return "token shares: " + "; ".join(notes) if notes else ""


@dataclass(frozen=True)
class TokenEvidence:
    """A token or sample behind a finding. `share` is its share of `share_of` (SHARE_OF names them);
    `exact` is True only for shares measured on the update (attribution or bucket steps)."""

    step: int
    sample_id: int | None = None
    position: int | None = None
    token_id: int | None = None
    text: str = ""
    share: float | None = None
    share_of: str = "logit_grad_norm"
    exact: bool = False
    prob: float | None = None
    rank: int = 0

    @classmethod
    def from_rows(cls, df, share_of: str = "count", shown: int = 10) -> tuple[TokenEvidence, ...]:
        """The first `shown` rows of a query (step, sample_id, position, token_id, token columns; a missing
        or null one stays None) as exact evidence, ranked in row order."""

        def pick(r, k):
            return None if k not in r or r[k] is None or r[k] != r[k] else int(r[k])  # r[k] != r[k]: NaN

        return tuple(
            cls(
                step=int(r["step"]),
                sample_id=pick(r, "sample_id"),
                position=pick(r, "position"),
                token_id=pick(r, "token_id"),
                text=str(r.get("token") or ""),
                share_of=share_of,
                exact=True,
                rank=i,
            )
            for i, (_, r) in enumerate(df.head(shown).iterrows())
        )

    def __post_init__(self):
        if self.share_of not in SHARE_OF:
            raise ValueError(f"unknown share_of {self.share_of!r}; known: {sorted(SHARE_OF)}")
        if EXACT_SHARE.get(self.share_of, self.exact) != self.exact:  # the footnote says what the share is
            raise ValueError(
                f"a {self.share_of!r} share is exact={EXACT_SHARE[self.share_of]}, got {self.exact}"
            )


@dataclass(frozen=True)
class Action:
    """Something to try, and where the advice comes from (a paper's arXiv id, a tool's documentation)."""

    text: str
    source: str


@dataclass(frozen=True, kw_only=True)  # nine fields: named at every call, never by position
class Finding:
    id: str
    severity: str
    confidence: float
    first_step: int | None
    last_step: int | None
    message: str
    evidence: dict = field(default_factory=dict)
    tokens: tuple[TokenEvidence, ...] = ()
    actions: tuple[Action, ...] = ()
    run: str = ""
    page: str = "overview"  # the dashboard page that shows it (tokengrad.app.views.findings links it)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if not (isinstance(self.confidence, float | int) and 0.0 <= self.confidence <= 1.0):
            raise ValueError(f"confidence must be in [0, 1], got {self.confidence!r}")
        object.__setattr__(self, "confidence", float(self.confidence))
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "actions", tuple(self.actions))

    @property
    def level(self) -> int:
        return SEVERITIES.index(self.severity)

    def at_least(self, severity: str) -> bool:
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
        return self.level >= SEVERITIES.index(severity)

    def as_dict(self) -> dict:
        return _jsonable(asdict(self))


class NotChecked(Exception):
    """A detector could not run on this run: `reason` names the setting or data it lacks. Raised by the
    detector; the engine fills in `detector` and `run` and lists it beside the findings, so a missing
    setting is reported instead of passing as a healthy run."""

    def __init__(self, reason: str, detector: str = "", run: str = ""):
        super().__init__(reason)
        self.reason, self.detector, self.run = reason, detector, run

    def __str__(self) -> str:
        return f"{self.detector or 'detector'}: not checked, {self.reason}"

    def __eq__(self, other) -> bool:
        return isinstance(other, NotChecked) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash((self.detector, self.reason, self.run))

    def as_dict(self) -> dict:
        return {"detector": self.detector, "run": self.run, "reason": self.reason}


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Machine findings last; before them and among them critical first, then higher confidence, then
    earlier onset, then id (tokengrad.doctor.ranking)."""
    from tokengrad.doctor.ranking import rank_findings as rank  # it reads the detector registry

    return rank(findings)


def _jsonable(value):
    """NaN/inf -> None and numpy scalars -> Python numbers, recursively (JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
