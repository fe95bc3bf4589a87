"""The layered layout, enforced twice from one table (tests/import_rules.py): statically, by reading every
import statement of every module of tokengrad/ (its app/ included; default tier, no subprocess), and in fresh
interpreters, where lazy imports and third-party packages show what a module really loads."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from import_rules import (
    ALLOWED,
    FACE,
    LOADED_FORBIDDEN,
    RECORD_FACE,
    RECORD_WINGS,
    THIRD_PARTY_FORBIDDEN,
    matches,
    rule_for,
)

REPO = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement in the file, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # `from tokengrad import schema` names a module: check the module, not the package face
            if node.module in (FACE, "tokengrad.read", "tokengrad.train", "tokengrad.integrations"):
                found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def violations(path: Path) -> list[str]:
    module = module_name(path)
    allowed = rule_for(module, ALLOWED)
    forbidden = rule_for(module, THIRD_PARTY_FORBIDDEN) or []
    bad = []
    for line, name in imports_of(path):
        where = f"{path.relative_to(REPO)}:{line} imports {name}"
        if any(matches(name, f) for f in forbidden):
            bad.append(where)
        elif allowed is not None and (name == FACE or matches(name, FACE)):
            if name == FACE or name in (f"{FACE}.read", f"{FACE}.train", f"{FACE}.integrations"):
                continue  # `from tokengrad import x` is judged by its x (added by imports_of)
            if not any(matches(name, p) for p in allowed):
                bad.append(where)
    return bad


SOURCES = sorted(p for d in ("tokengrad",) for p in (REPO / d).rglob("*.py"))


def test_every_module_has_a_rule():
    missing = [
        module_name(p)
        for p in SOURCES
        if module_name(p) != FACE and rule_for(module_name(p), ALLOWED) is None
    ]
    assert not missing, f"modules without an import rule in tests/import_rules.py: {missing}"


def test_no_import_crosses_a_layer():
    bad = [v for p in SOURCES if module_name(p) != FACE for v in violations(p)]
    assert not bad, "imports against tests/import_rules.py:\n" + "\n".join(bad)


def record_names(path: Path) -> list[tuple[int, str]]:
    """imports_of, with `from tokengrad.record import x` read as the module tokengrad.record.x where x is
    one (else as the package face itself)."""
    found = imports_of(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "tokengrad.record":
            home = REPO / "tokengrad" / "record"
            subs = [
                a.name for a in node.names if (home / f"{a.name}.py").exists() or (home / a.name).is_dir()
            ]
            if subs and len(subs) == len(node.names):
                found.remove((node.lineno, "tokengrad.record"))
            found += [(node.lineno, f"tokengrad.record.{x}") for x in subs]
    return found


def face_imports(path: Path) -> list[str]:
    """The imports of record/'s face in a module (the package: `from tokengrad.record import`)."""
    names = record_names(path)
    return [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for line, name in names
        if any(name == f or (f != "tokengrad.record" and matches(name, f)) for f in RECORD_FACE)
    ]


def test_no_wing_imports_the_face():
    wings = [p for p in SOURCES if any(matches(module_name(p), w) for w in RECORD_WINGS)]
    wings = [p for p in wings if module_name(p) not in RECORD_FACE]
    assert len(wings) >= 12, "record/'s wings not found"
    bad = [v for p in wings for v in face_imports(p)]
    assert not bad, "a wing of record/ imports its face:\n" + "\n".join(bad)


def test_the_wing_check_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from tokengrad.record import Recorder\nfrom tokengrad.record.buckets.step import x\n")
    probe2 = tmp_path / "probe2.py"
    probe2.write_text("def f():\n    from tokengrad.record.step_recorder import StepRecorder\n")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        assert len(face_imports(probe)) == 1 and len(face_imports(probe2)) == 1
    finally:
        REPO = saved


HOSTS = sorted(
    p.name for p in (REPO / "tokengrad" / "integrations").iterdir() if (p / "__init__.py").exists()
)


def test_no_host_imports_another_host():
    """What two hosts share lives in tokengrad/integrations/host.py; a host package never imports another."""
    assert {"trl", "verl", "openrlhf"} <= set(HOSTS)
    bad = []
    for host in HOSTS:
        others = [f"tokengrad.integrations.{h}" for h in HOSTS if h != host]
        for p in sorted((REPO / "tokengrad" / "integrations" / host).rglob("*.py")):
            bad += [
                f"{p.relative_to(REPO)}:{line} imports {name}"
                for line, name in imports_of(p)
                if any(matches(name, o) for o in others)
            ]
    assert not bad, "a host package imports another host's package:\n" + "\n".join(bad)


def test_record_top_level_stays_small():
    top = sorted(p.name for p in (REPO / "tokengrad" / "record").glob("*.py"))
    assert len(top) <= 12, f"tokengrad/record/ holds {len(top)} modules at its top level: {top}"


def test_the_static_check_can_fail(tmp_path):
    """An upward arrow is seen: nested imports are read, and record/ may not import the trainer or the
    package face; tokengrad/app/ may not import torch."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n    from tokengrad.train.trainer import Trainer\n    from tokengrad import __version__\n"
    )
    found = [name for _, name in imports_of(probe)]
    assert "tokengrad.train.trainer" in found and "tokengrad.__version__" in found
    allowed = rule_for("tokengrad.record.probe", ALLOWED)
    assert not any(matches(n, p) for n in found if n != FACE for p in allowed)
    assert "torch" in rule_for("tokengrad.app.views.probe", THIRD_PARTY_FORBIDDEN)


def loaded_after(module: str) -> list[str]:
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.subprocess
@pytest.mark.parametrize("module", sorted(LOADED_FORBIDDEN))
def test_import_edges(module):
    if module == "tokengrad.integrations.trl":
        pytest.importorskip("trl")
    loaded = loaded_after(module)
    bad = sorted(n for n in loaded for p in LOADED_FORBIDDEN[module] if matches(n, p))
    assert not bad, f"importing {module} loaded {bad[:8]}"


@pytest.mark.subprocess
def test_the_edge_check_sees_a_real_load():
    """The check itself can fail: importing the trainer does load record/ and torch."""
    loaded = loaded_after("tokengrad.train.trainer")
    assert "torch" in loaded and "tokengrad.record.recorder" in loaded


@pytest.mark.subprocess
def test_public_imports_stay():
    code = (
        "import tokengrad; from tokengrad import Recorder, load_run, token_stats, logprobs_with_stats, "
        "list_runs, SCHEMA_VERSION, __version__;"
        "from tokengrad.record import StepRecorder; assert callable(tokengrad.train.run);"
        "from tokengrad.read import load_run as lr2; assert lr2 is load_run;"
        "import tokengrad.objective.loss, tokengrad.cli, tokengrad.integrations.trl; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
