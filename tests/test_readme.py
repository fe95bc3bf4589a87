"""The README is the front door and stays true: its plain-PyTorch example runs as written and records what
it says, its Layout block is the package tree, its command list is `tokengrad --help`, it fits in 200 lines,
and every doc is linked from it and from docs/index.md."""

import re
import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 200


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return next(b for b in blocks if "with Recorder(" in b)


def test_readme_plain_loop_example_runs(tmp_path, capsys):
    script = tmp_path / "example.py"
    script.write_text(_example())
    ns = runpy.run_path(str(script))
    run = ns["run"]
    assert list(run.steps["step"]) == [0, 1, 2, 3]
    b = run.buckets
    assert sorted(b["step"].unique()) == [0, 2]  # buckets=2
    assert b.groupby("step")["update_share"].sum().round(4).tolist() == [1.0, 1.0]
    tok = run.tokens()
    assert len(tok) == 4 * 4 * 11 and tok["head_grad_norm"].notna().all()


def test_cli_help_and_inspect(tmp_path):
    from tokengrad.cli import main

    assert main(["--help"]) == 0
    assert main(["inspect", "--schema"]) == 0


def test_glossary_doc_is_current():
    """docs/glossary.md is generated: `tokengrad inspect --schema > docs/glossary.md`."""
    from tokengrad import schema

    doc = (DOCS / "glossary.md").read_text()
    assert doc == schema.describe(), "stale: run `tokengrad inspect --schema > docs/glossary.md`"


def test_trainer_doc_weighting_example_registers_a_working_rule():
    import torch

    from tokengrad.objective.weighting import WEIGHTINGS, TokenBatch

    text = (DOCS / "trainer.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "sqrt_p" in b)
    "sqrt_p" in WEIGHTINGS and WEIGHTINGS.unregister("sqrt_p")
    try:
        ns: dict = {}
        exec(block, ns)
        lp = torch.log(torch.tensor([[0.04, 0.81]]))
        w = WEIGHTINGS["sqrt_p"](
            TokenBatch(logprobs=lp, old_logprobs=lp, advantages=torch.ones(1, 2), mask=torch.ones(1, 2))
        )
        assert torch.allclose(
            w.loss_weight, torch.tensor([[0.5, 0.9]])
        )  # sqrt(.04)=.2 -> floor .5; sqrt(.81)=.9
    finally:
        "sqrt_p" in WEIGHTINGS and WEIGHTINGS.unregister("sqrt_p")


def test_readme_fits_in_200_lines():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move detail into a doc under docs/"


def _fenced_block_after(heading: str) -> str:
    text = README.read_text()
    assert heading in text, f"README.md has no {heading!r} section"
    return re.search(r"```\n(.*?)```", text[text.index(heading) :], flags=re.S).group(1)


def layout_paths(block: str) -> set[str]:
    """Paths the Layout block names: folders (`name/`) and modules (`name.py`) at the head of each line, two
    spaces of indentation per level below the folder named last one level up."""
    parents: dict[int, str] = {}
    named = set()
    for line in block.splitlines():
        if not line.strip():
            continue
        level = (len(line) - len(line.lstrip(" "))) // 2
        parent = parents.get(level - 1, "") if level else ""
        for word in line.split():
            if not (word.endswith("/") or word.endswith(".py")):
                break  # the description starts
            named.add(parent + word.rstrip("/"))
            if word.endswith("/"):
                parents[level] = parent + word
    return named


def package_tree() -> set[str]:
    """Every folder of tokengrad/ (caches and the shipped demo run's contents left out) and the
    modules at the top of tokengrad/."""
    tree = set()
    for top in ("tokengrad",):
        tree.add(top)
        for path in (REPO / top).rglob("*"):
            in_run = any((folder / "meta.json").is_file() for folder in (path, *path.parents))
            hidden = "__pycache__" in path.parts or path.name.startswith(".")
            if path.is_dir() and not hidden and not in_run:
                tree.add(path.relative_to(REPO).as_posix())
    tree |= {f"tokengrad/{p.name}" for p in (REPO / "tokengrad").glob("*.py") if p.name != "__init__.py"}
    return tree


def test_layout_parser_reads_nesting():
    block = "a/\n  x.py y.py   ground\n  b/      words b/ here\n    c/ d/\n  e/\nf/\n"
    assert layout_paths(block) == {"a", "a/x.py", "a/y.py", "a/b", "a/b/c", "a/b/d", "a/e", "f"}


def test_readme_layout_block_is_the_package_tree():
    named, tree = layout_paths(_fenced_block_after("## Layout")), package_tree()
    assert not tree - named, f"README Layout block misses {sorted(tree - named)}"
    assert not named - tree, f"README Layout block names what does not exist: {sorted(named - tree)}"


def test_readme_command_list_is_tokengrad_help(capsys):
    from tokengrad.cli import SUBCOMMANDS, main

    listed = [line.split()[1] for line in _fenced_block_after("## Command line").splitlines() if line.strip()]
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    assert listed == list(SUBCOMMANDS), f"README lists {listed}; `tokengrad --help` has {list(SUBCOMMANDS)}"
    assert all(name in help_text for name in listed)


def _links(path: Path) -> set[Path]:
    """Local files a markdown file links to, resolved against its folder (anchors dropped)."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    return {(path.parent / t).resolve() for t in targets if "://" not in t}


def all_docs() -> set[Path]:
    return {p.resolve() for p in DOCS.glob("*.md")} | {(REPO / "benchmarks" / "README.md").resolve()}


def test_every_doc_is_linked_from_readme_and_index():
    index = DOCS / "index.md"
    for page, expected in ((README, all_docs()), (index, all_docs() - {index.resolve()})):
        missing = sorted(p.relative_to(REPO).as_posix() for p in expected - _links(page))
        assert not missing, f"{page.relative_to(REPO)} does not link {missing}"


def test_local_links_of_the_docs_resolve():
    for page in [README, *sorted(all_docs())]:
        broken = sorted(str(p) for p in _links(page) if not p.exists())
        assert not broken, f"{page.relative_to(REPO)} links missing files {broken}"
