"""A run in a bucket whose recorder closed before every file reached the bucket (record/store/bucket.py)."""

from __future__ import annotations

from tokengrad.doctor.finding import Action, Finding
from tokengrad.doctor.registry import detector
from tokengrad.doctor.view import RunView
from tokengrad.read.status import not_uploaded


@detector("files_not_uploaded", tables=("ranks",))
def files_not_uploaded(view: RunView) -> list[Finding]:
    """Files that stayed in a rank's local staging folder when it closed: the bucket's copy of the run is
    behind (those steps, or the final status, are missing there) until a Recorder re-opens the run there."""
    behind = not_uploaded(view.run.rank_status)
    if not behind:
        return []
    total = sum(b["files_not_uploaded"] for b in behind)
    where = "; ".join(f"rank {b['rank']}: {b['files_not_uploaded']} in {b.get('staging')}" for b in behind)
    evidence = {
        "statistic": "upload.files_not_uploaded of the rank status files",
        "values": {str(b["rank"]): b["files_not_uploaded"] for b in behind},
    }
    action = Action(
        "open the run with a Recorder on the machine that recorded it (the upload resumes)", "docs/buckets.md"
    )
    message = f"{total} files not uploaded to {behind[0].get('url')} ({where})"
    whole_run = {"first_step": None, "last_step": None, "confidence": 1.0}  # a fact of the run, no step
    return [
        Finding(
            id="files_not_uploaded",
            severity="warning",
            message=message,
            evidence=evidence,
            actions=(action,),
            **whole_run,
        )
    ]
