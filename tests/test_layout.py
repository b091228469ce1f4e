"""The architecture's import rules, read from the source (AST), so a stray import fails here, not in review."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
    return modules


def test_the_library_does_not_import_the_evaluator():
    """gapo/ is the library; eval/ (and recipe/) use it, never the other way round (pass@k lives in gapo.passk)."""
    offenders = {}
    for path in sorted((ROOT / "gapo").rglob("*.py")):
        bad = {m for m in _imported_modules(path) if m.split(".")[0] in ("eval", "recipe")}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


def test_the_rule_sees_function_level_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from eval.passk import spread\n    import recipe.smoke\n")
    assert {"eval.passk", "recipe.smoke"} <= _imported_modules(probe)
