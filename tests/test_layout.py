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


def test_the_data_families_share_sources_not_each_other():
    """gapo/data: what both families need (sources, row schema, CLI skeleton) lives in shared modules, so neither
    family's module imports the other's."""
    data = ROOT / "gapo" / "data"
    families = {"gapo.data.math_datasets", "gapo.data.code_datasets"}
    offenders = {}
    for path in sorted(data.glob("*_datasets.py")) + [data / "cli.py", data / "sources.py", data / "parquet_io.py"]:
        own = f"gapo.data.{path.stem}"
        bad = (_imported_modules(path) & families) - {own}
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_the_sandbox_and_the_math_worker_import_only_the_standard_library():
    """The sandbox client runs alone under the system python (an unprivileged uid may not read the venv), so it
    imports nothing of ours; its executor runs as `python -I -S` (no site-packages) and imports its siblings (policy,
    process, cgroups) by plain name from their own folder, so those may name each other, and none may share a name
    with a standard module (it would shadow it there). The math worker imports math-verify and nothing of ours."""
    import sys

    sandbox = sorted((ROOT / "gapo" / "rewards" / "sandbox").glob("*.py"))
    siblings = {path.stem for path in sandbox} - {"__init__", "client"}
    assert siblings & set(sys.stdlib_module_names) == set()
    allowed = {"client.py": set(), "_worker.py": {"math_verify", "latex2sympy2_extended", "sympy"}}
    offenders = {}
    for path in sandbox + [ROOT / "gapo/rewards/math/_worker.py"]:
        extra = allowed.get(path.name, siblings)
        bad = {m for m in _imported_modules(path)
               if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] not in extra}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}

