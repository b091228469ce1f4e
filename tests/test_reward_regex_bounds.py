"""Every regular expression that reads model text answers in bounded time (issue 43: a reward that never returns
freezes a reward worker, and the run, forever).

The patterns are found, not listed: every compiled pattern in the namespace of every module of ``gapo.rewards``
(math, code, sandbox), ``gapo.arithmetic``, ``gapo.entrance`` and ``eval`` (dicts and tuples of patterns included).
Each is run (``search``, ``match``, ``fullmatch``) on a battery of strings built to make a backtracking engine try
every split of a run: runs of letters, digits, spaces, macros, braces, exponents, separators, after the prefixes the
patterns look for (a number, ``\\text{``, ``\\frac{``), ending in a character that makes the match fail. The bound is
CPU time (``ITIMER_PROF``, which interrupts a running match), so it does not depend on the machine being idle: a
pattern gets ``CPU_BUDGET_S`` for its whole battery, where the slowest takes milliseconds and a catastrophic one
(nested repeats that can split a run many ways, as the former unit-phrase pattern) takes forever at 40 characters.
The check is shown to tell: the former pattern is caught by the same battery.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

from tests.cpu_budget import over_budget

MODULE_ROOTS = ("gapo.rewards", "eval")
EXTRA_MODULES = ("gapo.arithmetic", "gapo.entrance")
CPU_BUDGET_S = 5.0
RUN = 200  # repetitions of a piece: ~400-800 characters, past the math reward's 400-character answer cap
PIECES = ("a", "ab ", "7", "7 ", " ", "\\a", "\\alpha ", "{", "}", "{7}", "^{2}", "^2", "/", ",", "7.", "(", ")",
          "a7", "\\,", "~", "-", "=", "x_", "\\text{a}", "a/", " a", "\n", "`", "```", "'", "\"", "\\\\", "a^")
PREFIXES = ("", "7 ", "\\text{", "\\frac{", "(7, ")
SUFFIXES = ("!", "\x00")
# the unit-phrase pattern that hung the math reward on "15 is the only positive integer that can be factored into 4
# and" (gapo/rewards/math/understood.py before issue 43)
FORMER_UNIT_WORD = re.compile(r"(?<=[\d}])\s*([A-Za-z]+(?:\s*(?:/|\^\{?\d\}?)?\s*[A-Za-z]*)*)"
                              r"(?:\s*\^\s*(?:\{\s*\d\s*\}|\d))?\s*$")


def _modules():
    mods = []
    for root in MODULE_ROOTS:
        pkg = importlib.import_module(root)
        mods.append(pkg)
        mods += [importlib.import_module(m.name) for m in pkgutil.walk_packages(pkg.__path__, root + ".")
                 if not m.name.endswith("__main__")]
    return mods + [importlib.import_module(name) for name in EXTRA_MODULES]


def _patterns_in(value, name, found: dict[str, re.Pattern]) -> None:
    if isinstance(value, re.Pattern):
        if all(p.pattern != value.pattern or p.flags != value.flags for p in found.values()):
            found[name] = value
    elif isinstance(value, dict):
        for key, item in value.items():
            _patterns_in(item, f"{name}[{key!r}]", found)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _patterns_in(item, f"{name}[{i}]", found)


def reward_patterns() -> dict[str, re.Pattern]:
    """{qualified name: pattern} of every compiled pattern in the modules that read model text (each once)."""
    found: dict[str, re.Pattern] = {}
    for module in _modules():
        for attr, value in vars(module).items():
            _patterns_in(value, f"{module.__name__}.{attr}", found)
    return found


ATTACKS = tuple(prefix + piece * RUN + suffix for prefix in PREFIXES for piece in PIECES for suffix in SUFFIXES)


def cpu_seconds_over_budget(pattern: re.Pattern, budget_s: float = CPU_BUDGET_S) -> bool:
    """Whether running ``pattern`` over ATTACKS needs more than ``budget_s`` CPU seconds (interrupted there)."""
    def battery():
        for text in ATTACKS:
            pattern.search(text)
            pattern.match(text)
            pattern.fullmatch(text)

    return over_budget(battery, budget_s)


PATTERNS = reward_patterns()


def test_the_search_finds_the_patterns_that_read_answers():
    names = set(PATTERNS)
    for expected in ("gapo.rewards.math.understood._TRAILING_UNIT_WORD", "gapo.rewards.math.understood._TRAILING_UNIT_TEXT",
                     "gapo.rewards.math.answer._REPEATING", "gapo.rewards.math.answer._DIGIT_GROUPS"):
        assert expected in names
    assert any(name.startswith("gapo.rewards.code.") for name in names)
    assert len(PATTERNS) >= 60, sorted(PATTERNS)


def test_the_battery_catches_a_catastrophic_pattern():
    assert cpu_seconds_over_budget(FORMER_UNIT_WORD, budget_s=1.0)
    # the fixed pattern reads the response that hung the old one: its last words after the last digit ("and", which
    # names no unit, so strip_units keeps the text)
    from gapo.rewards.math.understood import _TRAILING_UNIT_WORD, strip_units

    text = "15 is the only positive integer that can be factored into 4 and"
    assert _TRAILING_UNIT_WORD.search(text).group(1) == "and"
    assert strip_units(text) == text


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_is_bounded_on_adversarial_text(name):
    assert not cpu_seconds_over_budget(PATTERNS[name]), \
        f"{name} ({PATTERNS[name].pattern[:120]!r}) took over {CPU_BUDGET_S} CPU seconds on the attack battery"
