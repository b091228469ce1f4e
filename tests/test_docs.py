"""Docs say what is true: every file path and test the docs and docstrings name exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "launch" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SOURCES = [p for folder in ("gapo", "recipe", "eval", "launch") for p in sorted((ROOT / folder).rglob("*.py"))]
# a project path (optionally ::test_name, with or without a [param] suffix)
REF = re.compile(r"\b((?:tests|gapo|recipe|eval|configs|docs|launch)/[\w/.-]+\.(?:py|md|yaml|sh|sbatch))"
                 r"(?:::(\w+))?")


def references(path: Path):
    text = path.read_text(encoding="utf-8")
    return sorted({(m.group(1), m.group(2) or "") for m in REF.finditer(text)})


@pytest.mark.parametrize("doc", DOCS + SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_files_and_tests_exist(doc):
    missing = []
    for rel, test in references(doc):
        target = ROOT / rel
        if not target.exists():
            missing.append(rel)
        elif test and not re.search(rf"^(async )?def {re.escape(test)}\(", target.read_text(), re.M):
            missing.append(f"{rel}::{test}")
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_scan_finds_references():
    assert ("docs/verl-surface.md", "") in references(ROOT / "README.md")
    assert any(test for _, test in references(ROOT / "docs" / "verl-surface.md"))


# --- the README is the front page; the details live in docs/ -------------------------------------------------------
README = ROOT / "README.md"
README_MAX_BYTES = 15_000


def test_readme_fits_on_a_few_screens():
    assert len(README.read_bytes()) <= README_MAX_BYTES, "move details into a page under docs/ and link it"


def test_every_docs_page_is_linked_from_the_readme():
    text = README.read_text()
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert [p for p in pages if f"]({p}" not in text] == []


def _expand(name: str) -> list[str]:
    """`a_{x,y}` -> [`a_x`, `a_y`] (the README's shorthand for several configs)."""
    m = re.search(r"\{([^}]*)\}", name)
    return [name] if not m else [x for part in m.group(1).split(",") for x in _expand(name[:m.start()] + part +
                                                                                   name[m.end():])]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_experiments_make_targets_and_modules_named_in_docs_exist(doc):
    """Each `math/...` or `code/...` experiment is a config, each `make X` a Makefile target, each `python -m M` a
    module of this project or an installed one (found, not imported)."""
    import importlib.util

    text = doc.read_text()
    missing = []
    for name in re.findall(r"`((?:math|code)/[\w.{},-]+)`", text) + re.findall(r"submit\.sh ((?:math|code)/[\w.-]+)",
                                                                               text):
        missing += [f"configs/{n}.yaml" for n in _expand(name) if not (ROOT / "configs" / f"{n}.yaml").exists()]
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    # `make X` in code: after a backtick or at the start of a line (prose says "make it")
    missing += [f"make {t}" for t in re.findall(r"(?:`|^)make ([a-z][\w-]*)", text, re.M) if t not in targets]
    for module in set(re.findall(r"python -m ([\w.]+)", text)):
        if module in ("pip", "venv", "pytest"):
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(f"python -m {module}")
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_links_resolve_to_files_and_headings(doc):
    broken = []
    for link, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", doc.read_text()):
        if link.startswith(("http://", "https://")):
            continue
        target = (doc.parent / link).resolve() if link else doc
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md":
            headings = {_slug(line.lstrip("#")) for line in target.read_text().splitlines() if line.startswith("#")}
            if anchor not in headings:
                broken.append(f"{link}#{anchor}")
    assert not broken, f"{doc.relative_to(ROOT)} links to what does not exist: {broken}"
