"""A module's private names (a leading underscore) stay in it: a helper another module needs is public in
its home module, so a reader finds every user of a name by its public spelling."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def private_imports(source: str, module: str = "tokengrad") -> list[str]:
    """'module.name' for each private name imported from a tokengrad module (dunders are not private)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(module):
            out += [
                f"{node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return out


def test_no_module_imports_another_modules_private_name():
    found = {
        str(p.relative_to(REPO)): hits
        for d in ("tokengrad",)
        for p in sorted((REPO / d).rglob("*.py"))
        if (hits := private_imports(p.read_text()))
    }
    assert not found, f"private names imported across modules (make them public at home): {found}"


def test_the_scan_sees_a_private_import():
    src = "from tokengrad.record.stats import CHUNK_ROWS, _chunk_stats\nfrom tokengrad import __version__\n"
    assert private_imports(src) == ["tokengrad.record.stats._chunk_stats"]
