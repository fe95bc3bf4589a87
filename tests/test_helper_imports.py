"""Tests import the shared helpers (tests/*.py) by module name, never as `tests.<name>`: verl's wheel ships a
top-level `tests` package, and in .venv-verl that package shadows ours, so `from tests.bucket_server import
...` fails to load the conftest there (pyproject's pytest `pythonpath` puts tests/ and its rooms on
sys.path)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imports_of_tests_package(source: str) -> list[str]:
    """The `tests` / `tests.<x>` modules a Python source imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [n for n in names if n == "tests" or n.startswith("tests.")]
    return found


def test_no_test_file_imports_the_tests_package():
    offenders = {
        str(path.relative_to(TESTS)): hits
        for path in sorted(TESTS.rglob("*.py"))
        if (hits := imports_of_tests_package(path.read_text()))
    }
    assert offenders == {}


def test_the_check_sees_both_import_forms():
    source = "\n".join(
        [
            "import os",
            "from tests.bucket_server import bucket",
            "import tests.synthetic_runs as s",
            "from x import tests",
        ]
    )
    assert imports_of_tests_package(source) == ["tests.bucket_server", "tests.synthetic_runs"]
