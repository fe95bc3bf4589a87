"""Ranks whose folder of a per-rank table is gone: what every read of the run then lacks. No torch.

    for gap in missing_ranks(run.path, run.meta):
        print(gap.text)   # "steps 0–7 of the steps table (rank 1) missing: no steps/rank001 folder (...)"

Every rank of a run writes its own `steps` and `tokens` folders at every step it records (docs/scale.md), so
a rank the run knows (meta.json's world_size, a rank status file, a folder of another table) without a
folder of one of these tables, while another rank has one, lost that table's rows: a folder deleted, or a
copy that left it out. The steps it held are read from the footers of the rank's other tables' files.
Tables only rank 0 writes (evals) or that a run may not record at all are not checked; nor is an imported
run's steps table, which another framework's dump may hold for one rank only (prime-rl's per-step scalars).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokengrad import schema
from tokengrad.read import layout
from tokengrad.read.provenance import imported

PER_RANK_TABLES = ("steps", "tokens")  # written by every rank at every recorded step


@dataclass(frozen=True)
class MissingRank:
    table: str
    rank: int
    steps: tuple[int, int] | None  # what the rank's other tables hold, None when they hold nothing
    known_by: str  # how the run says the rank exists

    @property
    def what(self) -> str:
        if self.steps is None:
            return f"every row of the {self.table} table (rank {self.rank})"
        lo, hi = self.steps
        steps = f"step {lo}" if lo == hi else f"steps {lo}–{hi}"
        return f"{steps} of the {self.table} table (rank {self.rank})"

    verb = "missing"

    @property
    def text(self) -> str:
        folder = schema.rank_dir(self.table, self.rank)
        return f"{self.what} {self.verb}: no {folder} folder, though {self.known_by}"


def _known_ranks(run_dir: Path, meta: dict) -> dict[int, str]:
    """rank -> how the run says it exists."""
    known: dict[int, str] = {}
    for table in schema.TABLES:
        for folder in layout.rank_folders(run_dir, table):
            rank = layout.folder_rank(folder.name)
            if rank is not None and layout.entries(folder):
                known.setdefault(rank, f"{table}/{folder.name} holds files")
    for path in layout.rank_status_files(run_dir):
        rank = layout.folder_rank(path.stem)
        if rank is not None:
            known[rank] = f"ranks/{path.name} exists"
    world = meta.get("world_size")
    if isinstance(world, int) and not isinstance(world, bool) and 0 < world <= 4096:
        known.update({r: f"meta.json says world_size {world}" for r in range(world)})
    return known


def missing_ranks(run_dir: str | Path, meta: dict) -> list[MissingRank]:
    """The (table, rank) pairs of PER_RANK_TABLES whose folder is missing while another rank has one."""
    run_dir = Path(run_dir)
    known = _known_ranks(run_dir, meta)
    out = []
    tables = ("tokens",) if imported(meta) else PER_RANK_TABLES
    for table in tables:
        present = {
            layout.folder_rank(f.name) for f in layout.rank_folders(run_dir, table) if layout.entries(f)
        }
        if not present:
            continue  # the run does not record the table at all
        for rank in sorted(set(known) - present):
            gap = MissingRank(table=table, rank=rank, steps=_steps_of(run_dir, rank), known_by=known[rank])
            out.append(gap)
    return out


def _steps_of(run_dir: Path, rank: int) -> tuple[int, int] | None:
    """The step range the rank's files of any table hold (their footers)."""
    ranges = [
        r
        for table in schema.TABLES
        for _, _, path in layout.entries(run_dir / schema.rank_dir(table, rank))
        for r in (layout.step_range(path),)
        if r is not None and table != "evals"  # evals carry step -1 (before training)
    ]
    return (min(lo for lo, _ in ranges), max(hi for _, hi in ranges)) if ranges else None
