"""The run's files themselves: data files that cannot be read, rank folders that are gone. A damaged run
must not read as a healthy one: each loss is a critical finding naming the files and the steps they held
(tokengrad.read.unreadable, tokengrad.read.missing_ranks), and the engine reports every detector that reads
a table with a loss and found nothing as "not checked" (tokengrad.doctor.engine)."""

from __future__ import annotations

from tokengrad.doctor.finding import Action, Finding
from tokengrad.doctor.registry import detector
from tokengrad.doctor.view import RunView

_RESTORE = Action(
    "restore the files from a backup or the machine that wrote them; the rest of the run reads as it is",
    "docs/run_format.md",
)
_SHOWN_FILES = 10_000  # file paths kept in one finding's evidence


def _finding(name: str, message: str, steps: tuple[int, int] | None, statistic: str, values: dict) -> Finding:
    lo, hi = steps or (None, None)
    values = {**values, "steps": list(steps) if steps else None}
    return Finding(
        id=name,
        severity="critical",
        confidence=1.0,
        first_step=lo,
        last_step=hi,
        message=message,
        evidence={"statistic": statistic, "values": values},
        actions=(_RESTORE,),
    )


@detector("unreadable_files", tables=(), about="data")
def unreadable_files(view: RunView) -> list[Finding]:
    """Data files that cannot be read (cut, corrupt, column types that clash, a rank's rows in another
    rank's folder): what each one takes away, by steps where a footer says, else by commits."""
    statistic = "data files the reader skipped (Run.unreadable), grouped by table, rank and reason"
    return [
        _finding(
            "unreadable_files",
            loss.text,
            loss.steps,
            statistic,
            {
                "table": loss.table,
                "rank": loss.rank,
                "commits": list(loss.commits),
                "files": [str(u.path.relative_to(view.run.path)) for u in loss.files[:_SHOWN_FILES]],
                "n_files": len(loss.files),
                "reason": loss.files[0].reason,
            },
        )
        for loss in view.losses.unreadable
    ]


@detector("rank_missing", tables=(), about="data")
def rank_missing(view: RunView) -> list[Finding]:
    """A rank the run knows (world_size, a status file, another table) without its steps or tokens folder:
    that rank's rows of the table are missing from every read."""
    statistic = "ranks known to the run without a folder of a table every rank writes"
    return [
        _finding("rank_missing", gap.text, gap.steps, statistic, {"table": gap.table, "rank": gap.rank})
        for gap in view.losses.missing
    ]
