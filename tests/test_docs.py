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
