"""Names a user types at start-up (experiment configs, config keys) and the closest right ones to a wrong one.

Standard library only: `launch/submit.sh` runs it with any python 3 (`python -m gapo.config_names experiment
CONFIG_DIR NAME`), so that the shell script and `python -m recipe.main_gapo` share one definition of an experiment
and one message for an unknown one.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

_HYDRA_LINE = re.compile(r"^hydra:", re.MULTILINE)


def closest(word: str, choices, n: int = 3) -> list[str]:
    """Up to `n` of `choices` closest to `word` (difflib's ratio >= 0.6, best first; an exact match first of all)."""
    choices = [str(c) for c in choices]
    if word in choices:
        return [word]
    return difflib.get_close_matches(word, choices, n=n, cutoff=0.6)


def one_of(names: list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def unknown_key(key: str, valid, what: str = "a config key", addable: bool = False) -> str:
    """The message for a dotted `key` whose last part is not one of `valid` (the names at its level): the closest valid
    keys, in full, or else every one; `addable` (a free-form level, no dataclass behind it) adds hydra's ``+``."""
    parent, _, leaf = key.rpartition(".")
    prefix = f"{parent}." if parent else ""
    near = closest(leaf, valid)
    if near:
        return f"{key} is not {what}: did you mean {one_of([prefix + n for n in near])}?"
    where = parent or "the top level"
    names = sorted(str(v) for v in valid)
    known = f"the keys under {where} are {', '.join(names)}" if names else f"{where} has no keys"
    add = f"; to add a key it does not have, write +{key}=<value>" if addable else ""
    return f"{key} is not {what}; {known}{add}"


def experiments(config_dir) -> list[str]:
    """The experiments under `config_dir`, as `--config-name` takes them (``math/r1_1.5b_gapo``), sorted: the
    primary configs, i.e. the yaml files with a top-level ``hydra:`` key (they set hydra's search path); config
    groups (``base/``, ``model/``, ``platform/``, ``vigor/``) and data files have none."""
    root = Path(config_dir)
    names = []
    for path in root.rglob("*.yaml"):
        if _HYDRA_LINE.search(path.read_text(encoding="utf-8", errors="replace")):
            names.append(path.relative_to(root).with_suffix("").as_posix())
    return sorted(names)


def unknown_experiment(name: str, config_dir) -> str | None:
    """None when `name` (``.yaml`` optional) is an experiment under `config_dir`; else the message that names it, the
    closest experiments and every experiment, one a line."""
    name = name.removesuffix(".yaml")
    known = experiments(config_dir)
    if name in known:
        return None
    path = Path(config_dir) / f"{name}.yaml"
    why = f"{path} has no top-level hydra: key: a config group, not a run" if path.is_file() else f"no {path}"
    near = closest(name, known)
    hint = f" Did you mean {one_of(near)}?" if near else ""
    listing = "\n".join(f"  {e}" for e in known)
    return f"unknown experiment '{name}' ({why}).{hint} Available experiments:\n{listing}"


def _main(argv: list[str]) -> int:
    """`experiment CONFIG_DIR NAME`: exit 0 for an experiment, else print the message and exit 1."""
    if len(argv) != 3 or argv[0] != "experiment":
        print("usage: python -m gapo.config_names experiment CONFIG_DIR NAME", file=sys.stderr)
        return 2
    message = unknown_experiment(argv[2], argv[1])
    if message:
        print(message)
    return 1 if message else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
