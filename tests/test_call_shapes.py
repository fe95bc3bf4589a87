"""Call shapes of the house rules: no def in the package or the app takes 6 or more positional parameters
and no call passes 6 or more positional arguments; records and long signatures take keywords
(`@dataclass(kw_only=True)`, a `*` in the signature), so a call names what it passes. Signatures a host
framework fixes are listed in ALLOWED with the reason; an entry that no longer matches anything fails.
A record of the package (a dataclass or NamedTuple defined in tokengrad/ or app/) is built with at most 3
positional arguments anywhere in the repository: past that, each field is named."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("tokengrad",) for p in (REPO / d).rglob("*.py"))
MAX_POSITIONAL = 5

# "path:function" (the def, or the function a call sits in) -> why it keeps 6+ positional slots
ALLOWED = {
    "tokengrad/integrations/openrlhf/trainer.py:forward": (
        "the wrapper takes OpenRLHF PolicyLoss.forward's own signature (log_probs, old_log_probs, "
        "advantages, action_mask, rollout_log_probs, dp_size, ...): it stands in for the host's method"
    ),
    "tokengrad/integrations/verl/losses.py:policy_loss": (
        "verl's register_policy_loss fixes the signature (old_log_prob, log_prob, advantages, response_mask, "
        "loss_agg_mode, config, rollout_is_weights): names and order are verl's"
    ),
}


def _positional(args: ast.arguments) -> list[str]:
    return [a.arg for a in args.posonlyargs + args.args if a.arg not in ("self", "cls")]


def wide_shapes(source: str, path: str = "<source>") -> dict[str, str]:
    """{"path:function": what} for each def with 6+ positional parameters and each call passing 6+
    positional arguments (`function`: the def, or the innermost def the call sits in; "<module>" outside)."""
    found: dict[str, str] = {}

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = child.name
                if len(params := _positional(child.args)) > MAX_POSITIONAL:
                    found[f"{path}:{inner}"] = f"def {inner} with {len(params)} positional parameters"
            elif isinstance(child, ast.Call) and len(child.args) > MAX_POSITIONAL:
                if not any(isinstance(a, ast.Starred) for a in child.args):
                    call = ast.unparse(child.func)
                    found.setdefault(
                        f"{path}:{where}", f"{call}() with {len(child.args)} positional arguments"
                    )
            visit(child, inner)

    visit(ast.parse(source), "<module>")
    return found


def test_no_call_or_def_with_six_positional_slots():
    found = {}
    for path in SOURCES:
        found.update(wide_shapes(path.read_text(), str(path.relative_to(REPO))))
    unlisted = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not unlisted, (
        f"6+ positional parameters or arguments (make the tail keyword-only: `*` in the def, "
        f"`@dataclass(kw_only=True)` for records, and name them at the call): {unlisted}"
    )
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED entries that no longer have 6+ positional slots (remove them): {stale}"


def test_the_scanner_finds_a_six_positional_call_and_def():
    src = (
        "def f(a, b, c, d, e, g):\n"
        "    return a\n"
        "def ok(a, b, c, *, d, e, g):\n"
        "    return f(1, 2, 3, 4, 5, 6)\n"
        "ok(1, 2, 3, d=4, e=5, g=6)\n"
        "f(*range(6))\n"
    )
    assert wide_shapes(src, "m.py") == {
        "m.py:f": "def f with 6 positional parameters",
        "m.py:ok": "f() with 6 positional arguments",
    }
    method = "class C:\n    def m(self, a, b, c, d, e):\n        return C.m(self, a, b, c, d, e)\n"
    assert wide_shapes(method, "c.py") == {"c.py:m": "C.m() with 6 positional arguments"}


MAX_RECORD_POSITIONAL = 3
RECORD_USERS = ("tokengrad", "app", "tests", "benchmarks", "scripts")


def _is_record(node: ast.ClassDef) -> bool:
    """A dataclass (`@dataclass`, `@dataclass(...)`, `@dataclasses.dataclass`) or a NamedTuple subclass."""
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if ast.unparse(target).split(".")[-1] == "dataclass":
            return True
    return any(ast.unparse(base).split(".")[-1] == "NamedTuple" for base in node.bases)


def record_names(sources: dict[str, str]) -> set[str]:
    """Names of the dataclasses and NamedTuples defined in the given {path: source}."""
    return {
        node.name
        for source in sources.values()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and _is_record(node)
    }


def records_in_scope(source: str, records: set[str], package: bool) -> set[str]:
    """The package's record names a file sees: a class the file defines itself shadows a record of the same
    name, unless the file is the package's own (`package`) and that class is the record."""
    classes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)]
    return records - {n.name for n in classes if not (package and _is_record(n))}


def positional_record_calls(source: str, records: set[str], path: str = "<source>") -> list[str]:
    """ "path:line Name() with N positional arguments" for each call of a record constructor (by its name,
    bare or as an attribute) passing more than MAX_RECORD_POSITIONAL positional arguments."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or len(node.args) <= MAX_RECORD_POSITIONAL:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in records:
            found.append(f"{path}:{node.lineno} {name}() with {len(node.args)} positional arguments")
    return sorted(found)


def test_records_of_the_package_are_built_by_keyword():
    sources = {str(p.relative_to(REPO)): p.read_text() for p in SOURCES}
    records = record_names(sources)
    found = []
    for path in sorted(p for d in RECORD_USERS for p in (REPO / d).rglob("*.py")):
        rel, source = str(path.relative_to(REPO)), path.read_text()
        found += positional_record_calls(source, records_in_scope(source, records, rel in sources), rel)
    assert not found, (
        f"records built with more than {MAX_RECORD_POSITIONAL} positional arguments (name the fields, "
        f"or make the dataclass kw_only=True): {found}"
    )


def test_the_record_scanner_finds_a_positional_record_call():
    src = (
        "import dataclasses\n"
        "from typing import NamedTuple\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class D:\n    a: int\n    b: int\n    c: int\n    d: int\n"
        "class N(NamedTuple):\n    a: int\n    b: int\n    c: int\n    d: int\n"
        "class Plain:\n    pass\n"
        "D(1, 2, 3, 4)\n"
        "D(1, 2, 3, d=4)\n"
        "m.N(1, 2, 3, 4)\n"
        "N(a=1, b=2, c=3, d=4)\n"
        "Plain(1, 2, 3, 4)\n"
    )
    records = record_names({"m.py": src})
    assert records == {"D", "N"}
    assert positional_record_calls(src, records_in_scope(src, records, package=True), "m.py") == [
        "m.py:16 D() with 4 positional arguments",
        "m.py:18 N() with 4 positional arguments",
    ]
    # a file outside the package that defines its own D calls that one, not the package's record
    shadow = "class D:\n    pass\nD(1, 2, 3, 4)\nN(1, 2, 3, 4)\n"
    assert records_in_scope(shadow, records, package=False) == {"N"}
    assert positional_record_calls(shadow, records_in_scope(shadow, records, package=False), "b.py") == [
        "b.py:4 N() with 4 positional arguments"
    ]
