"""Every public function and class, and every public method of a public class, has a docstring (read from the
source with the AST, so nothing is imported).

Scanned: gapo/ (every subpackage), eval/ and recipe/ (entry points and subfolders). Public: a name without a leading
underscore, at module level (also inside a module-level ``if`` / ``try`` / ``with``) or directly in a public class.
Exempt:
- dunder methods other than ``__init__`` (``__call__``, ``__repr__``, ...: the protocol says what they do);
- ``__init__`` when the class docstring names every one of its parameters (``*args`` / ``**kwargs`` aside);
- property setters (the getter's docstring documents the attribute);
- ``ALLOWED``: methods that only answer a foreign interface, documented together by their class docstring.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("gapo", "eval", "recipe")
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)

# "path::Class" -> the methods exempt ("*": all of them). Keep this short: only classes whose methods answer an
# interface defined elsewhere, each with a constant or a no-op, and whose class docstring says what they answer
# (a docstring per method would restate the interface's name). Each entry must still be needed (test below).
ALLOWED = {
    # verl's PlatformBase: 23 methods, each the CPU's constant ("cpu", 1 device, gloo) or a no-op
    "gapo/cpu/platform.py::PlatformCPU": "*",
    # the torch.cuda namespace verl calls through device_module: zero memory statistics, the CPU generator
    "gapo/cpu/platform.py::CPUDeviceModule": "*",
    # verl's rollout-server control calls, no-ops on a CPU (nothing to free, pause, abort or profile)
    "gapo/cpu/hf_rollout.py::HFRolloutServer": {
        "wake_up", "sleep", "clear_kv_cache", "release_kv_cache", "resume_kv_cache", "abort_all_requests",
        "resume_generation", "start_profile", "stop_profile",
    },
}


def _documented(node) -> bool:
    return bool((ast.get_docstring(node) or "").strip())


def _top_level(body: list):
    """Statements at module level, looking into ``if`` / ``try`` / ``with`` blocks (not into functions)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)
        else:
            yield node


def _is_setter(node) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter") for d in node.decorator_list)


def _init_documented_by_class(cls: ast.ClassDef, init) -> bool:
    """The class docstring names every parameter of ``__init__`` (as a word), so it documents the arguments."""
    doc = ast.get_docstring(cls) or ""
    a = init.args
    names = [p.arg for p in (a.posonlyargs + a.args)[1:] + a.kwonlyargs]  # [1:]: self
    return bool(doc.strip()) and all(re.search(rf"\b{re.escape(n)}\b", doc) for n in names)


def missing_docstrings(source: str, rel: str, allowed: dict = ALLOWED) -> list[str]:
    """``rel::name`` of each public function, class or method in ``source`` that has no docstring (see the top)."""
    missing = []
    for node in _top_level(ast.parse(source).body):
        if not isinstance(node, (*FUNCTIONS, ast.ClassDef)) or node.name.startswith("_"):
            continue
        if not _documented(node):
            missing.append(f"{rel}::{node.name}")
        if not isinstance(node, ast.ClassDef):
            continue
        exempt = allowed.get(f"{rel}::{node.name}", set())
        for item in node.body:
            if not isinstance(item, FUNCTIONS) or _documented(item):
                continue
            name = item.name
            if name == "__init__":
                if _init_documented_by_class(node, item):
                    continue
            elif name.startswith("_") or _is_setter(item) or exempt == "*" or name in exempt:
                continue  # private, a dunder, a setter, or allowed
            missing.append(f"{rel}::{node.name}.{name}")
    return missing


def _sources():
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, path.relative_to(ROOT).as_posix()


def test_every_public_function_and_class_has_a_docstring():
    missing = [m for path, rel in _sources() for m in missing_docstrings(path.read_text(encoding="utf-8"), rel)]
    assert missing == [], f"{len(missing)} public names without a docstring:\n" + "\n".join(missing)


def test_every_allowed_entry_is_still_needed():
    """An entry names an existing class, and each listed method exists there without a docstring."""
    stale = []
    for key, methods in ALLOWED.items():
        rel, cls_name = key.split("::")
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        cls = next((n for n in _top_level(tree.body) if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
        if cls is None or not _documented(cls):
            stale.append(f"{key}: no such documented class")
            continue
        undocumented = {n.name for n in cls.body if isinstance(n, FUNCTIONS) and not _documented(n)}
        if methods == "*":
            if not undocumented:
                stale.append(f"{key}: every method is documented; drop the entry")
        else:
            stale += [f"{key}.{m}: documented or gone" for m in sorted(set(methods) - undocumented)]
    assert stale == []


def test_the_scan_sees_what_is_missing():
    source = '''
def public(): pass
def _private(): pass
def documented():
    """Yes."""
class Bare:
    def method(self): pass
    def _helper(self): pass
    def __repr__(self): return ""
    @property
    def value(self):
        """The value."""
    @value.setter
    def value(self, v): pass
class Documented:
    """Takes `size` and `name`."""
    def __init__(self, size, *, name, **kwargs): pass
class Partly:
    """Takes `size`."""
    def __init__(self, size, name): pass
    def hook(self): pass
    def other(self): pass
class _Hidden:
    def method(self): pass
if True:
    def conditional(): pass
'''
    allowed = {"probe.py::Partly": {"hook"}}
    assert missing_docstrings(source, "probe.py", allowed) == [
        "probe.py::public", "probe.py::Bare", "probe.py::Bare.method", "probe.py::Partly.__init__",
        "probe.py::Partly.other", "probe.py::conditional",
    ]
