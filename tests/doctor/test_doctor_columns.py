"""The doctor reads only columns the run format defines (tokengrad.schema), so renaming a column cannot
silently turn a detector off.

At run time: every detector runs on synthetic runs made to fire it (tests/doctor/test_doctor.py CASES and the
integrity defects below) through a RunView that records every column name asked for: by `column`/`need`
and `has_token_columns`, in the SQL it sends (parsed by DuckDB's own parser: column references, minus
the names the query itself defines), and read from the steps/samples/buckets/layers frames. A name that
no table of the query or frame defines, and that is not a documented extra column (SAMPLE_EXTRA,
STEP_EXTRA), fails. In the source: every attribute of a schema namespace exists, no detector tests a bare
string against a frame's columns (the recording cannot see that), and no detector module imports
another detector module (each owns its thresholds; shared ones are in tokengrad/doctor/thresholds.py).
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path
from types import SimpleNamespace

import duckdb
import numpy as np
import pandas as pd
import pytest
from doctor_runs import write_doctor_run
from test_doctor import CASES, ONSET, spike

from tokengrad import schema
from tokengrad.doctor.engine import examine
from tokengrad.doctor.registry import DETECTORS, detector
from tokengrad.doctor.view import RunView
from tokengrad.read.runs import load_run

DOCTOR = Path(__file__).resolve().parents[2] / "tokengrad" / "doctor"
_EXTRA = {"samples": set(vars(schema.SAMPLE_EXTRA).values()), "steps": set(vars(schema.STEP_EXTRA).values())}


def defined(table: str) -> set[str]:
    """The columns a table of the run format defines: its fixed columns and its documented extras."""
    return set(schema.column_names(table)) | _EXTRA.get(table, set())


# ---- the recording view ------------------------------------------------------------------------------
class _Frame(pd.DataFrame):
    """A view table that records the column names read from it; what it derives is a plain frame (whose
    columns may be names the detector made itself)."""

    _metadata = ["_table", "_reads"]

    @property
    def _constructor(self):
        return pd.DataFrame

    def _read(self, key, how: str) -> None:
        keys = [key] if isinstance(key, str) else list(key) if isinstance(key, list | tuple) else []
        self._reads += [(f"{self._table} frame {how}", self._table, k) for k in keys if isinstance(k, str)]

    def __getitem__(self, key):
        self._read(key, "[]")
        return super().__getitem__(key)

    def groupby(self, by=None, *args, **kwargs):
        self._read(by, "groupby")
        return super().groupby(by, *args, **kwargs)

    def dropna(self, *args, subset=None, **kwargs):
        self._read(subset, "dropna")
        return super().dropna(*args, subset=subset, **kwargs)

    def drop_duplicates(self, subset=None, *args, **kwargs):
        self._read(subset, "drop_duplicates")
        return super().drop_duplicates(subset, *args, **kwargs)

    def set_index(self, keys, *args, **kwargs):
        self._read(keys, "set_index")
        return super().set_index(keys, *args, **kwargs)

    def nlargest(self, n, columns, *args, **kwargs):
        self._read(columns, "nlargest")
        return super().nlargest(n, columns, *args, **kwargs)


_PARSER = duckdb.connect()


@functools.cache  # the detectors send the same queries run after run
def sql_reads(query: str) -> tuple[frozenset[str], tuple[tuple[str, frozenset[str]], ...]]:
    """(tables the query reads, ((column name, names it may resolve to besides the tables' columns), ...))
    from DuckDB's parse tree (json_serialize_sql). A reference may name an alias or CTE the query defines,
    except inside the expression that defines that alias (`SELECT x AS x` must still read a real x)."""
    tree = json.loads(_PARSER.execute("SELECT json_serialize_sql(?)", [query]).fetchall()[0][0])
    assert not tree["error"], (query, tree)
    tables: set[str] = set()
    ctes: set[str] = set()
    aliases: set[str] = set()
    refs: list[tuple[str, str | None]] = []

    def walk(node, defining: str | None) -> None:
        if isinstance(node, list):
            for x in node:
                walk(x, defining)
            return
        if not isinstance(node, dict):
            return
        if node.get("type") == "BASE_TABLE":
            tables.add(node["table_name"])
        if node.get("class") == "COLUMN_REF":
            refs.append((node["column_names"][-1], defining))
        refs.extend((c, None) for c in node.get("using_columns") or ())
        for entry in (node.get("cte_map") or {}).get("map", ()):
            ctes.add(entry["key"])
        alias = node.get("alias") or None
        if alias:
            aliases.add(alias)
        for value in node.values():
            walk(value, alias or defining)

    walk(tree["statements"], None)
    return frozenset(tables - ctes), tuple((name, frozenset((aliases | ctes) - {own})) for name, own in refs)


class RecordingView(RunView):
    """A RunView that records (where, table, column) for every column name a detector asks for."""

    def __init__(self, run, upto=None):
        super().__init__(run, upto)
        self.reads: list[tuple[str, str, str]] = []
        self.unknown: list[tuple[str, str, str]] = []  # names no table of their query/frame defines

    def _check(self, where: str, tables: set[str], name: str, local: set[str] = frozenset()) -> None:
        self.reads.append((where, ",".join(sorted(tables)), name))
        if name not in local and not any(name in defined(t) for t in tables):
            self.unknown.append((where, ",".join(sorted(tables)), name))

    def _frame(self, table: str, df: pd.DataFrame) -> _Frame:
        out = _Frame(df)
        object.__setattr__(out, "_table", table)
        object.__setattr__(out, "_reads", [])
        self._frames.append(out)
        return out

    @property
    def _frames(self) -> list:
        return self.__dict__.setdefault("_frame_list", [])

    def collect(self) -> None:
        """Move the frames' recorded reads into reads/unknown."""
        for f in self._frames:
            for where, table, name in f._reads:
                self._check(where, {table}, name)
            f._reads.clear()

    steps = property(lambda self: self._cached("steps", lambda: RunView.steps.func(self)))
    samples = property(lambda self: self._cached("samples", lambda: RunView.samples.func(self)))
    buckets = property(lambda self: self._cached("buckets", lambda: RunView.buckets.func(self)))
    layers = property(lambda self: self._cached("layers", lambda: RunView.layers.func(self)))

    def _cached(self, table: str, make):
        key = f"_rec_{table}"
        if key not in self.__dict__:
            self.__dict__[key] = self._frame(table, make())
        return self.__dict__[key]

    def column(self, name: str):
        self._check("view.column", {"steps"}, name)
        return super().column(name)

    def has_token_columns(self, *names: str) -> bool:
        for name in names:
            self._check("view.has_token_columns", {"tokens"}, name)
        return super().has_token_columns(*names)

    def token_columns(self) -> frozenset[str]:
        raise AssertionError("a detector asks view.has_token_columns(...), which the test can record")

    def sql(self, query: str, params: list | None = None) -> pd.DataFrame:
        tables, refs = sql_reads(query)
        assert tables <= set(schema.TABLES), (tables, query)
        for name, local in refs:
            self._check(f"sql {query[:60]!r}", tables, name, local)
        return super().sql(query, params)


def check_run(path: Path, upto: int | None = None, only: list[str] | None = None):
    """(the recording view, the diagnosis) of every detector (or `only`) on the run; fails on a name the
    schema lacks, then on a detector that raised (a renamed column the run lacks, read unguarded)."""
    view = RecordingView(load_run(path), upto)
    result = examine(view, only)
    view.collect()
    assert view.unknown == [], view.unknown
    errors = [f.message for f in result.findings if f.id == "detector_error"]
    assert errors == [], errors
    return view, result


# ---- runs that make each detector read all it reads ----------------------------------------------------
def _after(df: pd.DataFrame) -> pd.Series:
    return df["step"] >= ONSET


def _tokens(t):
    from doctor_runs import tokens_of

    t["tokens"] = tok = tokens_of(t["samples"], np.random.default_rng(0))
    return tok


def old_constant(t):
    tok = _tokens(t)
    tok.loc[_after(tok) & (tok["sample_id"] == 3), "old_logprob"] = -2.0


def rollout_zero(t):
    tok = _tokens(t)
    tok.loc[_after(tok), "rollout_logprob"] = 0.0


def is_zero(t):
    tok = _tokens(t)
    tok["is_weight"] = np.where(_after(tok) & (tok["sample_id"] == 3), 0.0, 1.0)


def reward_nan(t):
    s = t["samples"]
    s.loc[_after(s) & (s["sample_id"] == 2), "reward"] = np.nan


def reward_constant(t):
    t["samples"]["reward"] = 0.0


def count_mismatch(t):
    t["steps"]["n_token_rows"] = None  # a step is checked where its rows are all there (or not counted)
    t["steps"].loc[t["steps"]["step"] == 7, "n_tokens"] = 5


def attributed_spike(t):
    """A spike on an attribution step, with the on-spike replay's norms (steps.grad_norm_without_top{k})."""
    spike(t)
    tok, st = t["tokens"], t["steps"]
    tok["update_share"] = np.where(tok["step"] == 42, 0.001, np.nan)
    for k in schema.REPLAY_K:
        st[f"grad_norm_without_top{k}"] = np.where(st["step"] == 42, 10.0 / k, np.nan)


def masked_count(t):  # TRL's count of IS-masked sequences, no token mask records
    st = t["steps"]
    st["is_masked_sequences"] = np.where(_after(st), 4, 1)


def stale_mismatch(t):
    """rollout_mismatch growing, on a run that records policy versions (the staleness split)."""
    CASES["rollout_mismatch"][0](t)
    tok = _tokens(t)
    tok["policy_version"] = tok["step"]
    tok["trainer_version"] = tok["step"] + (tok["sample_id"] % 2)


def trl_truncation(t):
    """No max_new_tokens in the settings: the share TRL logs itself (STEP_EXTRA)."""
    st = t["steps"]
    st[schema.STEP_EXTRA.trl_completions_clipped_ratio] = np.where(_after(st), 0.8, 0.0)


def rank_lost(t):
    """A second rank that recorded steps but whose token rows are gone."""
    st = t["steps"]
    t["steps"] = pd.concat([st, st.assign(rank=1)], ignore_index=True)


def sample_repeated(t):
    """Rank 1 recorded sample 0 of every step again."""
    tok = _tokens(t)
    t["tokens"] = pd.concat([tok, tok[tok["sample_id"] == 0].assign(rank=1)], ignore_index=True)


_TRL = {"config": {"integration": "trl", "args": {}}}
# name -> (edit, meta, the detector it fires)
EXTRA_CASES = {
    "old_constant": (old_constant, None, "logprob_constant"),
    "rollout_zero": (rollout_zero, None, "rollout_logprob_gap"),
    "is_zero": (is_zero, None, "is_weight_zeroed"),
    "reward_nan": (reward_nan, None, "reward_nonfinite"),
    "reward_constant": (reward_constant, None, "reward_constant"),
    "count_mismatch": (count_mismatch, None, "token_count_mismatch"),
    "attributed_spike": (attributed_spike, None, "gradient_spike"),
    "masked_count": (masked_count, None, "masked_sequences"),
    "stale_mismatch": (stale_mismatch, None, "rollout_mismatch"),
    "trl_truncation": (trl_truncation, _TRL, "truncation"),
    "rank_lost": (rank_lost, {"world_size": 2}, "rank_without_tokens"),
    "sample_repeated": (sample_repeated, None, "sample_id_repeated"),
}
RUNS = {**{name: (c[0], None, name) for name, c in CASES.items()}, **EXTRA_CASES}


@pytest.mark.parametrize("case", sorted(RUNS))
def test_every_column_a_detector_reads_is_in_the_schema(tmp_path, case):
    """The detector on a run that makes it fire: the path that reads the most (the others stop early)."""
    edit, meta, fires = RUNS[case]
    view, result = check_run(write_doctor_run(tmp_path / case, edit=edit, meta=meta), only=[fires])
    assert fires in {f.id for f in result.findings}, (case, [f.id for f in result.findings])
    assert view.unknown == [], view.unknown
    assert view.reads  # the recording saw the reads


def test_every_detector_on_a_healthy_run_reads_schema_columns(tmp_path):
    view, result = check_run(write_doctor_run(tmp_path / "healthy"))
    assert not [f for f in result.findings if f.at_least("warning")]
    assert view.unknown == []
    assert len({name for _, _, name in view.reads}) > 30


def test_the_live_cut_reads_only_schema_columns(tmp_path):
    run = write_doctor_run(tmp_path / "kl", edit=CASES["kl_blowup"][0])
    view, result = check_run(run, upto=45)
    assert [f.first_step for f in result.findings if f.id == "kl_blowup"] == [40]
    assert view.unknown == []


def test_every_detector_was_run_to_a_finding():
    """The runs above make every registered detector fire (rows_dropped, files_not_uploaded, unreadable_files
    and rank_missing read rank files and folders, no column; tests/doctor/test_doctor.py,
    tests/record/test_bucket_runs.py, tests/read/test_damaged_runs.py)."""
    from tokengrad.doctor.engine import load_detectors

    load_detectors()
    files = {"rows_dropped", "files_not_uploaded", "unreadable_files", "rank_missing"}
    assert set(DETECTORS) - files == {fires for _, _, fires in RUNS.values()}


@pytest.mark.parametrize(
    ("read", "where"),
    [
        (lambda v: v.need("reward_sd"), "view.column"),  # a steps column renamed in a detector
        (lambda v: v.sql("SELECT step, entropi FROM tokens WHERE step = 3"), "sql"),
        (lambda v: v.sql("SELECT sum(x) AS x FROM (SELECT coef AS y FROM tokens)"), "sql"),
        (lambda v: v.samples.dropna(subset=["rewards"]), "samples frame"),
        (lambda v: v.has_token_columns("rollout_logprobs"), "view.has_token_columns"),
    ],
)
def test_a_column_the_schema_lacks_fails(tmp_path, read, where):
    """The check itself: a detector that reads a name the schema does not define is caught, whether the
    run has the column or not (a missing column only turns the detector off)."""

    @detector("reads_a_renamed_column")
    def reads_a_renamed_column(view):
        read(view)
        return []

    try:
        view = RecordingView(load_run(write_doctor_run(tmp_path / "r", n_steps=12)))
        examine(view, ["reads_a_renamed_column"])
        view.collect()
    finally:
        DETECTORS.unregister("reads_a_renamed_column")
    assert [u[0] for u in view.unknown if u[0].startswith(where)], view.unknown


def test_sql_reads_tells_aliases_from_columns():
    tables, refs = sql_reads(
        "WITH t AS (SELECT step, count(*) AS rows FROM tokens GROUP BY step) "
        "SELECT s.step, t.rows, s.n_tokens AS n FROM steps s JOIN t USING (step) ORDER BY n"
    )
    assert tables == {"tokens", "steps"}
    names = {name for name, local in refs if name not in local}
    assert names == {"step", "n_tokens"}  # rows and n are the query's own names


# ---- the source --------------------------------------------------------------------------------------
NAMESPACES = {k: v for k, v in vars(schema).items() if isinstance(v, SimpleNamespace)}
MODULES = sorted(DOCTOR.glob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_schema_names_exist(path):
    """Every `TOK.x`, `STEP.x`, ... a doctor module uses is a column of the schema."""
    missing = [
        f"{path.name}:{n.lineno} {n.value.id}.{n.attr}"
        for n in ast.walk(_tree(path))
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id in NAMESPACES
        and not hasattr(NAMESPACES[n.value.id], n.attr)
    ]
    assert missing == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_bare_column_test_against_a_frame(path):
    """`"kl" in df.columns` reads a column the recording cannot see: it names it through the schema, and
    the tokens table is asked through view.has_token_columns (recorded)."""
    bad = []
    for n in ast.walk(_tree(path)):
        if isinstance(n, ast.Compare) and isinstance(n.left, ast.Constant) and isinstance(n.left.value, str):
            if any(isinstance(c, ast.Attribute) and c.attr == "columns" for c in n.comparators):
                bad.append(f"{path.name}:{n.lineno} {n.left.value!r} in ...columns")
        if path.name != "view.py" and isinstance(n, ast.Attribute) and n.attr == "token_columns":
            bad.append(f"{path.name}:{n.lineno} token_columns() (use view.has_token_columns)")
    assert bad == []


@pytest.mark.parametrize("path", sorted(DOCTOR.glob("detect_*.py")), ids=lambda p: p.name)
def test_no_detector_module_reads_a_neighbours_thresholds(path):
    """Each detector module owns its thresholds; shared ones live in tokengrad/doctor/thresholds.py."""
    imports = []
    for n in ast.walk(_tree(path)):
        if isinstance(n, ast.ImportFrom) and n.module:
            names = [n.module] + [f"{n.module}.{a.name}" for a in n.names]
            imports += [m for m in names if m.rsplit(".", 1)[-1].startswith("detect_")]
        elif isinstance(n, ast.Import):
            imports += [a.name for a in n.names if a.name.rsplit(".", 1)[-1].startswith("detect_")]
    assert imports == [], f"{path.name} imports {imports}"
