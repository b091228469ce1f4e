"""Per-source test protocol of the code reward (DeepCoder's): which tests run, their time limits, the prompt.

One table, :data:`PROTOCOLS`, is the single source of these defaults. Both the data preparation
(:mod:`gapo.data.code_datasets`: which tests a row keeps, how its prompt is written, which known-broken problems
are left out) and the scorer (:mod:`gapo.rewards.code.score`: which tests run and for how long) read it, so a row is
prepared and scored under one protocol.

What DeepCoder does (rllm, commit 18e446c5 "Deepcoder Release"):

- ``rllm/rewards/code_reward.py``, ``check_correctness`` (TACO/APPS/CodeContests, and PrimeIntellect through
  ``primeintellect_check_correctness``): ``timeout_per_test=12``, ``max_tests=15`` (the 15 longest inputs).
  It sets no limit on the whole problem (``process.join()`` without a timeout); the tests run one after
  the other, so 12 s x tests bounds it.
- same file, ``lcb_check_correctness_v2`` (LiveCodeBench, train and test): every test, ``timeout=6`` per
  test, and a global limit of ``(timeout + 1) * n_tests + 5`` seconds.
- same file, ``humanevalplus_check_correctness``: ``timeout_per_test=1`` times the number of test inputs,
  for the whole test program.
- ``scripts/data/deepcoder_dataset.py`` (``make_map_fn``): rows named ``livecodebench`` (its train and test
  sets) get LiveCodeBench's prompt (``rllm/data/utils.py``, ``fetch_live_code_bench_system_prompt``, with the
  texts of ``rllm/system_prompts.py``); every other row's prompt is the ``problem`` column as given (TACO's
  question, PrimeIntellect's own ``prompt``: ``rllm/data/preprocess/code/{taco,primeintellect}.ipynb``).
- ``rllm/data/preprocess/code/humanevalplus.ipynb`` drops HumanEval+'s ``find_zero`` (/32, ``'_poly' in
  tests``): "a broken test case that the official solution can't pass".

Our per-problem limit is LiveCodeBench's formula for every source, ``(test_timeout_s + 1) * n + 5``: for
TACO/PrimeIntellect it is at least DeepCoder's implicit bound (12 s x n, tests in sequence); our tests run
in parallel, so it is rarely what stops a problem. HumanEval(+): the answer is one program that runs every
recorded call (:mod:`gapo.rewards.code.score`), limited to ``test_timeout_s`` x the number of calls, as rllm does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

# The per-problem limit when none is set: (per-test limit + PER_TEST_SLACK_S) x tests + BASE_SLACK_S, as
# rllm's lcb_check_correctness_v2 (18e446c5) computes its global timeout.
PER_TEST_SLACK_S = 1.0
BASE_SLACK_S = 5.0
PROMPT_STYLES = ("lcb", "as_given", "humaneval")
# Keys that reward_kwargs.source_protocol.<source> may set (the rest are data-preparation settings).
OVERRIDABLE = ("max_tests", "test_timeout_s", "problem_timeout_s")

# LiveCodeBench's instruction as DeepCoder writes it (rllm 18e446c5, rllm/system_prompts.py; the same text
# at every later rllm commit read, up to 6d5c2c59^).
LCB_SYSTEM_MESSAGE = ("You are an expert Python programmer. You will be given a question (problem specification) "
                      "and will generate a correct Python program that matches the specification and passes all "
                      "tests.")
LCB_FORMAT_WITH_STARTER = ("You will use the following starter code to write the solution to the problem and "
                           "enclose your code within delimiters.")
LCB_FORMAT_WITHOUT_STARTER = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not "
                              "directly test on the sample inputs). Enclose your code within delimiters as follows. "
                              "Ensure that when the python program runs, it reads the inputs, runs the algorithm and "
                              "writes output to STDOUT.")


def lcb_prompt(problem: str, starter_code: str | None = None) -> str:
    """DeepCoder's LiveCodeBench prompt (``fetch_live_code_bench_system_prompt``, rllm 18e446c5
    ``rllm/data/utils.py``), character for character: the problem goes in as given, and the format line follows
    it directly (no separator: DeepCoder's rows read that way, and base-model numbers depend on the prompt)."""
    prompt = LCB_SYSTEM_MESSAGE + "\n\n" + problem
    if starter_code:
        prompt += f"### Format: {LCB_FORMAT_WITH_STARTER}\n```python\n{starter_code}\n```\n\n"
    else:
        prompt += f"### Format: {LCB_FORMAT_WITHOUT_STARTER}\n```python\n# YOUR CODE HERE\n```\n\n"
    return prompt + "### Answer: (use the provided format with backticks)\n\n"


@dataclass(frozen=True)
class SourceProtocol:
    """How the problems of one source are tested and prompted.

    Attributes:
        max_tests: tests run per problem, the ones with the longest inputs (DeepCoder's choice); ``None``: every
            test. The data preparation keeps the same ones, so a row holds exactly what is run.
        test_timeout_s: wall-clock limit per test (HumanEval(+): per recorded call, times the number of calls,
            for the one program that runs them). ``None``: the sandbox's own (``SandboxConfig.test_timeout_s``).
        problem_timeout_s: limit for the whole problem; ``None``: ``(test_timeout_s + 1) * tests + 5``
            (HumanEval: the answer program's limit), or the sandbox's own when ``test_timeout_s`` is ``None``.
        max_gt_bytes: data preparation: most bytes of tests a row keeps (whole tests dropped); ``None``: no cap.
            Only sources with a test cap have one: a source whose every test runs must not lose tests.
        prompt: data preparation: ``lcb`` (LiveCodeBench's instruction, :func:`lcb_prompt`), ``as_given`` (the
            problem text unchanged) or ``humaneval`` (the function prompt in a python block, then an instruction).
        broken: data preparation: ``(problem id, why)`` of problems left out unless ``--keep-broken``.
    """

    max_tests: int | None
    test_timeout_s: float | None
    problem_timeout_s: float | None = None
    max_gt_bytes: int | None = None
    prompt: str = "as_given"
    broken: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        _check_value("max_tests", self.max_tests)
        _check_value("test_timeout_s", self.test_timeout_s)
        _check_value("problem_timeout_s", self.problem_timeout_s)
        if self.max_gt_bytes is not None and (type(self.max_gt_bytes) is not int or self.max_gt_bytes <= 0):
            raise ValueError(f"max_gt_bytes must be a positive integer or None, got {self.max_gt_bytes!r}")
        if self.prompt not in PROMPT_STYLES:
            raise ValueError(f"prompt must be one of {PROMPT_STYLES}, got {self.prompt!r}")

    def problem_budget(self, n_tests: int, test_timeout_s: float) -> float:
        """The per-problem limit for ``n_tests`` tests of ``test_timeout_s`` each (see ``problem_timeout_s``)."""
        if self.problem_timeout_s is not None:
            return float(self.problem_timeout_s)
        return (test_timeout_s + PER_TEST_SLACK_S) * max(n_tests, 1) + BASE_SLACK_S


def _check_value(key: str, value) -> None:
    """``max_tests``: an integer >= 0 (0 and None: every test); timeouts: a number > 0 or None."""
    if value is None:
        return
    if key == "max_tests":
        if type(value) is not int or value < 0:
            raise ValueError(f"max_tests must be an integer >= 0 (0 or null: every test), got {value!r}")
        return
    if type(value) not in (int, float) or not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{key} must be a number of seconds > 0 (null: the default), got {value!r}")


# Training subsets from TACO and PrimeIntellect: 15 longest inputs, 12 s per test (check_correctness).
_CAPPED = SourceProtocol(max_tests=15, test_timeout_s=12.0, max_gt_bytes=1 << 20, prompt="as_given")
# LiveCodeBench, train and evaluation alike: every test, 6 s each (lcb_check_correctness_v2), LCB's prompt.
_LCB = SourceProtocol(max_tests=None, test_timeout_s=6.0, prompt="lcb")
# HumanEval(+): 1 s per test input for the whole program (humanevalplus_check_correctness).
_HUMANEVAL = SourceProtocol(max_tests=None, test_timeout_s=1.0, prompt="humaneval")
HUMANEVALPLUS_32 = ("HumanEval/32", "its test asserts `_poly(*candidate(*inp), inp) <= 0.0001`, which unpacks the "
                    "float that find_zero returns (TypeError) and swaps _poly's arguments: the canonical solution "
                    "scores 0 (rllm drops it too)")

PROTOCOLS: dict[str, SourceProtocol] = {
    "deepcoder_taco": _CAPPED,
    "deepcoder_primeintellect": _CAPPED,
    "deepcoder_lcb": _LCB,
    "livecodebench": _LCB,
    "humaneval": _HUMANEVAL,
    "humanevalplus": replace(_HUMANEVAL, broken=(HUMANEVALPLUS_32,)),
    # Other names the scorer answers to (hub names of the same data).
    "taco": _CAPPED,
    "primeintellect": _CAPPED,
    "lcbv5": _LCB,
}
# Rows scored without a data_source (direct calls of score_code_batch): DeepCoder's default cap (15, the
# defaults of check_correctness, which rllm also applies to a source it does not know) and the sandbox's limits.
DEFAULT_PROTOCOL = SourceProtocol(max_tests=15, test_timeout_s=None)
CODE_SOURCES = tuple(PROTOCOLS)


def source_key(data_source) -> str:
    """The table's name for ``data_source``: the whole name, else its last ``/`` part (case-insensitive), as
    the reward dispatcher (:mod:`gapo.rewards`) reads it. Unknown names raise ``ValueError``."""
    full = str(data_source).strip().lower()
    for key in (full, full.rsplit("/", 1)[-1]):
        if key in PROTOCOLS:
            return key
    raise ValueError(f"no code protocol for data_source {data_source!r}; known: {', '.join(PROTOCOLS)}")


def resolve_protocols(overrides: Mapping | None = None) -> dict[str, SourceProtocol]:
    """:data:`PROTOCOLS` with ``overrides`` applied: ``{source: {key: value}}``, keys among :data:`OVERRIDABLE`;
    a value of ``None`` keeps the table's. This is ``reward_kwargs.source_protocol`` (a Hydra mapping works).

    Raises ``ValueError`` naming the bad source, key or value and what is allowed.
    """
    table = dict(PROTOCOLS)
    if overrides is None:
        return table
    if not isinstance(overrides, Mapping):
        raise ValueError(f"source_protocol must be a mapping {{source: {{key: value}}}}, "
                         f"got {type(overrides).__name__}")
    for source, settings in overrides.items():
        if str(source) not in PROTOCOLS:
            raise ValueError(f"source_protocol.{source}: unknown code source; use one of {', '.join(PROTOCOLS)}")
        if settings is None:
            continue
        if not isinstance(settings, Mapping):
            raise ValueError(f"source_protocol.{source} must be a mapping of {', '.join(OVERRIDABLE)}, "
                             f"got {settings!r}")
        changes = {}
        for key, value in settings.items():
            if key not in OVERRIDABLE:
                raise ValueError(f"source_protocol.{source}.{key}: unknown key; settable per source at reward "
                                 f"time: {', '.join(OVERRIDABLE)} (prompts and byte caps are set when the data "
                                 f"is prepared)")
            if value is None:
                continue
            try:
                _check_value(key, value)
            except ValueError as e:
                raise ValueError(f"source_protocol.{source}.{key}: {e}") from None
            changes[key] = value
        if changes:
            if changes.get("max_tests") == 0:
                changes["max_tests"] = None  # 0 = every test, stored as the table's "no cap"
            table[str(source)] = replace(table[str(source)], **changes)
    return table


def protocol_for(data_source, table: Mapping[str, SourceProtocol] | None = None) -> SourceProtocol:
    """The protocol of ``data_source`` (``None``: :data:`DEFAULT_PROTOCOL`) in ``table`` (default: the table)."""
    if data_source is None:
        return DEFAULT_PROTOCOL
    return (table or PROTOCOLS)[source_key(data_source)]


__all__ = ["CODE_SOURCES", "DEFAULT_PROTOCOL", "OVERRIDABLE", "PROTOCOLS", "SourceProtocol", "lcb_prompt",
           "protocol_for", "resolve_protocols", "source_key"]
