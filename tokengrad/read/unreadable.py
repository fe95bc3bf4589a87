"""What a run's unreadable data files take away: the files, grouped, and the steps they held. No torch.

    run = load_run("runs/demo")
    run.steps                                  # reading skips what it cannot read ...
    run.unreadable                             # ... and lists it: [Unreadable(path, table, rank, ...)]
    for loss in losses(run.path, run.unreadable):
        print(loss.text)   # "steps 0–7 of the steps table (rank 0) unreadable: steps/rank000/...: ..."

A file's name gives its table, its rank and the writer's commits it holds (tokengrad.read.layout), never its
steps. The steps are read from the footers of the other tables' files of the same rank whose commits lie
inside the lost ones (every table of a commit holds the same steps: one bundle per commit), else from the
file's own footer when only its columns clash; without either the loss is named by its commits. Files of
one table and rank next to each other in commit order that fail for the same reason are one loss, so 5,000
empty files are one line, not 5,000.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from tokengrad import schema
from tokengrad.read import layout
from tokengrad.read.missing_ranks import MissingRank, missing_ranks


@dataclass(frozen=True, kw_only=True)
class Unreadable:
    """A data file the reader skipped: where it lies, the commits its name says it holds, why."""

    path: Path
    table: str
    rank: int | None
    first: int
    last: int
    reason: str


def unreadable(path: Path, reason: str) -> Unreadable:
    """The record of a skipped file at RUN/TABLE/rankRRR/sFIRST-LAST.parquet."""
    path = Path(path)
    rng = schema.parse_file_name(path.name) or (-1, -1)
    rank = layout.folder_rank(path.parent.name)
    return Unreadable(
        path=path,
        table=path.parent.parent.name,
        rank=rank,
        first=rng[0],
        last=rng[1],
        reason=reason.replace(str(path), "it"),
    )


@dataclass(frozen=True)
class Loss:
    """Consecutive unreadable files of one table and rank that fail alike, and the steps they held."""

    files: tuple[Unreadable, ...]
    steps: tuple[int, int] | None  # min and max step, None when no footer says

    @property
    def table(self) -> str:
        return self.files[0].table

    @property
    def rank(self) -> int | None:
        return self.files[0].rank

    @property
    def commits(self) -> tuple[int, int]:
        return self.files[0].first, self.files[-1].last

    @property
    def what(self) -> str:
        """'steps 0–7 of the steps table (rank 0)', or by commits when the steps are unknown."""
        rank = f"rank {self.rank}" if self.rank is not None else "no rank folder"
        if self.steps is not None:
            lo, hi = self.steps
            return f"{_span('step', lo, hi)} of the {self.table} table ({rank})"
        lo, hi = self.commits
        return f"{_span('commit', lo, hi)} of the {self.table} table ({rank}; which steps, no file says)"

    @property
    def text(self) -> str:
        """One line: what is lost, the file (first and last of a group, with the count) and why."""
        first, last = self.files[0], self.files[-1]
        where = _relative(first.path)
        if len(self.files) > 1:
            where = f"{len(self.files):,} files {where} … {last.path.name}"
        return f"{self.what} {self.verb}: {where}: {first.reason}"

    @property
    def verb(self) -> str:
        return "unreadable" if self.files[0].reason.startswith("corrupt") else "not read"


def _span(word: str, lo: int, hi: int) -> str:
    return f"{word} {lo}" if lo == hi else f"{word}s {lo}–{hi}"


def _relative(path: Path) -> str:
    """TABLE/rankRRR/FILE: the part of the path inside the run."""
    return "/".join(path.parts[-3:])


def losses(run_dir: str | Path, items: list[Unreadable]) -> list[Loss]:
    """The run's unreadable files as losses, by table, rank and commit; each with the steps it held."""
    steps = _StepFinder(Path(run_dir))
    out: list[Loss] = []
    group: list[Unreadable] = []
    for u in sorted(items, key=lambda u: (u.table, u.rank if u.rank is not None else -1, u.first, u.last)):
        prev = group[-1] if group else None
        if (
            prev
            and (prev.table, prev.rank, prev.reason) == (u.table, u.rank, u.reason)
            and (u.first == prev.last + 1)
        ):
            group.append(u)
            continue
        if group:
            out.append(Loss(files=tuple(group), steps=steps(group)))
        group = [u]
    if group:
        out.append(Loss(files=tuple(group), steps=steps(group)))
    return out


class _StepFinder:
    """The steps of lost commits, from the footers of the other tables' files of the same rank."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._entries: dict[tuple[int, str], list[tuple[int, int, Path]]] = {}

    def __call__(self, group: list[Unreadable]) -> tuple[int, int] | None:
        first, last = group[0].first, group[-1].last
        found = [r for r in map(self._own, group) if r]
        for table in schema.TABLES:
            if group[0].rank is None or table == group[0].table:
                continue
            found += self._inside(group[0].rank, table, first, last)
        if not found:
            return None
        return min(lo for lo, _ in found), max(hi for _, hi in found)

    @staticmethod
    def _own(u: Unreadable) -> tuple[int, int] | None:
        """The file's own step range when its footer reads (its columns clash, a page is corrupt)."""
        try:
            return layout.step_range(u.path) if u.path.stat().st_size else None
        except OSError:
            return None

    def _inside(self, rank: int, table: str, first: int, last: int) -> list[tuple[int, int]]:
        key = (rank, table)
        if key not in self._entries:
            folder = self.run_dir / schema.rank_dir(table, rank)
            self._entries[key] = sorted(layout.entries(folder))
        entries = self._entries[key]
        at = bisect.bisect_left(entries, (first,))
        out = []
        for lo, hi, path in entries[at:]:
            if lo > last:
                break
            if hi <= last:
                rng = layout.step_range(path)
                out += [rng] if rng else []
        return out


@dataclass(frozen=True)
class RunLosses:
    """Everything a run's reads lack: its unreadable files (as losses) and its missing rank folders."""

    unreadable: tuple[Loss, ...]
    missing: tuple[MissingRank, ...]

    def __bool__(self) -> bool:
        return bool(self.unreadable or self.missing)

    @property
    def lines(self) -> list[str]:
        return [x.text for x in (*self.unreadable, *self.missing)]

    def about(self, tables: tuple[str, ...]) -> str | None:
        """Why a check of `tables` cannot be trusted: the first loss of one of them (and how many more),
        None when they lost nothing."""
        hit = [x for x in (*self.unreadable, *self.missing) if x.table in tables]
        if not hit:
            return None
        first = hit[0]
        lost = f"{first.what} {first.verb}"
        return lost + (f" (and {len(hit) - 1} more losses)" if len(hit) > 1 else "")


def run_losses(run) -> RunLosses:
    """A tokengrad.read.Run's losses: every table's footers checked (Run.check_files), then grouped."""
    items = run.check_files()
    return RunLosses(tuple(losses(run.path, items)), tuple(missing_ranks(run.path, run.meta)))
