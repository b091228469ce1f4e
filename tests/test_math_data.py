"""Tests for the math data preparation: registry, conversion of each dataset from its fixture (the hub
schema), parquet output that verl's RLHFDataset loads, and the CLI (success and its error messages)."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from gapo.data import DATASETS, INSTRUCTION, get_spec, load_rows, prepare, to_parquet
from gapo.data.math_datasets import (
    MissingColumnWarning,
    RowCountWarning,
    convert_rows,
    normalize_answer,
    read_local_file,
)
from gapo.data.prepare_math import main as cli_main
from tests.conftest import load_with_verl

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "math"
NAMES = ("deepscaler", "aime24", "aime25", "amc23", "amc22_23", "math500", "minerva", "olympiadbench")

# Hand-checked ground truths of the fixture rows, after post-processing.
EXPECTED_GROUND_TRUTH = {
    "deepscaler": [r"-\frac{2}{3}", "26", "-8"],
    "aime24": ["204", "25", "809"],
    "aime25": ["70", "16", "117"],
    "amc23": ["27", "4", "8", "18"],  # float64 in the source: 27.0 -> "27"
    "amc22_23": ["142", "144", "8"],  # AI-MO/aimo-validation-amc stores floats too
    "math500": [r"\left( 3, \frac{\pi}{2} \right)", "26000", r"\frac{14}{3}"],
    "minerva": ["3.83e35", "1.6", "2.5"],
    "olympiadbench": ["130", r"\frac{1}{2}", "2, 3"],  # lists, $...$ unwrapped, joined
}
EXTRA_INFO_KEYS = {"split", "index", "problem", "raw_answer", "solution", "level", "subject", "source_id"}


def fixture(name: str) -> Path:
    return FIXTURES / f"{name}.jsonl"


def fixture_rows(name: str) -> list[dict]:
    return [json.loads(line) for line in fixture(name).read_text().splitlines()]


# --- registry ----------------------------------------------------------------------------------


def test_registry_names_are_the_reward_data_sources():
    # The math reward registers exactly these data_source names.
    assert tuple(DATASETS) == NAMES
    for name, spec in DATASETS.items():
        assert spec.data_source == name and get_spec(name) is spec
        assert spec.role == ("train" if name == "deepscaler" else "test")
        assert fixture(name).is_file(), f"every registered dataset ships a fixture: {name}"


def test_unknown_dataset_names_the_valid_ones():
    with pytest.raises(KeyError, match="valid: deepscaler, aime24, aime25, amc23, amc22_23, math500, minerva, "
                                       "olympiadbench"):
        get_spec("gsm8k")


def test_instruction_is_deepscalers():
    assert INSTRUCTION == "Let's think step by step and output the final answer within \\boxed{}."
    assert "\\boxed{}" in INSTRUCTION and "\\\\" not in INSTRUCTION  # one literal backslash


def test_both_amc_sets_are_registered_under_their_own_names():
    """DeepScaleR's AMC is 83 problems (AMC 12 2022 + 2023, rllm's amc.json = AI-MO/aimo-validation-amc);
    amc23 (math-ai/amc23) is the 40 problems of 2023 only. Both are offered, named apart."""
    from gapo.rewards import get_scorer

    amc23, amc = get_spec("amc23"), get_spec("amc22_23")
    assert (amc23.hub_name, amc23.split, amc23.expected_rows) == ("math-ai/amc23", "test", 40)
    assert (amc.hub_name, amc.split, amc.expected_rows) == ("AI-MO/aimo-validation-amc", "train", 83)
    assert (amc.question_field, amc.answer_field, amc.id_field) == ("problem", "answer", "id")
    assert "DeepScaleR" in amc.note and "2022 + 2023" in amc.note and "2023 only" in amc23.note
    assert get_scorer("amc22_23") is get_scorer("amc23")  # the math reward takes both
    rows = load_rows(amc, fixture("amc22_23"))
    assert [r["extra_info"]["raw_answer"] for r in rows] == ["142.0", "144.0", "8.0"]
    assert [r["extra_info"]["source_id"] for r in rows] == ["0", "1", "82"]


# --- OlympiadBench: copies with other columns -------------------------------------------------------


def _olympiad_copy(tmp_path, rows: list[dict]) -> Path:
    path = tmp_path / "olympiadbench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_olympiadbench_accepts_a_string_answer_column_and_warns_about_missing_optional_columns(tmp_path):
    # the hub's math-ai/olympiadbench (~251 kB for 675 problems): question and a string `answer`, no solution
    src = _olympiad_copy(tmp_path, [{"question": "Compute $1+1$.", "answer": "$2$"},
                                    {"question": "Find $x$.", "answer": "\\frac{1}{2}"}])
    with pytest.warns(MissingColumnWarning, match=r"no column\(s\) \['id', 'solution', 'subfield'\]") as caught:
        rows = load_rows(get_spec("olympiadbench"), src)
    assert "['solution', 'source_id', 'subject'] will be null" in str(caught[0].message)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "\\frac{1}{2}"]
    assert rows[0]["extra_info"]["raw_answer"] == "$2$" and rows[0]["extra_info"]["solution"] is None


def test_olympiadbench_accepts_the_list_column_of_either_name(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # OlympiadBench's own columns: nothing missing, nothing to warn about
        own = load_rows(get_spec("olympiadbench"), fixture("olympiadbench"))
    assert [r["reward_model"]["ground_truth"] for r in own] == EXPECTED_GROUND_TRUTH["olympiadbench"]
    assert all(r["extra_info"]["solution"] for r in own)
    # DeepScaleR's olympiad_bench.json: problem / answer (a list), solution, subfield, id
    src = _olympiad_copy(tmp_path, [{"id": 7, "problem": "Find all $n$.", "answer": ["$2$", "$3$"],
                                     "solution": ["Try small $n$."], "subfield": "Algebra"}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = load_rows(get_spec("olympiadbench"), src)
    assert rows[0]["reward_model"]["ground_truth"] == "2, 3" and rows[0]["extra_info"]["raw_answer"] == '["$2$", "$3$"]'
    assert (rows[0]["extra_info"]["source_id"], rows[0]["extra_info"]["subject"]) == ("7", "Algebra")
    bad = _olympiad_copy(tmp_path, [{"question": "q", "solution": "s"}])
    with pytest.raises(KeyError, match="no column\\(s\\) \\['final_answer' or 'answer'\\]"):
        load_rows(get_spec("olympiadbench"), bad)


def test_olympiadbench_expects_675_rows_and_warns_on_another_count(tmp_path, monkeypatch, capsys):
    import gapo.data.math_datasets as md

    spec = get_spec("olympiadbench")
    assert spec.expected_rows == 675
    row = {"question": "Compute $1+1$.", "final_answer": ["$2$"], "solution": ["2"], "subfield": "A", "id": 1}
    monkeypatch.setattr(md, "read_hub", lambda spec, hub_name=None: [dict(row, id=i) for i in range(rows)])
    rows = 674
    with pytest.warns(RowCountWarning, match=r"674 rows in hub math-ai/olympiadbench \(test\), 675 expected "
                                             r"\(.*674 is another release's count\)"):
        summary = prepare(spec, out_dir=tmp_path / "a")
    assert summary.rows_written == 674 and "675 expected" in capsys.readouterr().out
    rows = 675
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prepare(spec, out_dir=tmp_path / "b").rows_written == 675


# --- conversion of each dataset from its fixture ------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_fixture_converts_to_verl_rows(name):
    spec = get_spec(name)
    raw = fixture_rows(name)
    rows = load_rows(spec, fixture(name))
    assert len(rows) == len(raw)
    assert [r["reward_model"]["ground_truth"] for r in rows] == EXPECTED_GROUND_TRUTH[name]
    for i, (row, src) in enumerate(zip(rows, raw)):
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == name and row["ability"] == "math"
        assert row["reward_model"]["style"] == "rule"
        problem = src[spec.question_field].strip()
        assert row["prompt"] == [{"role": "user", "content": f"{problem} {INSTRUCTION}"}]
        info = row["extra_info"]
        assert set(info) == EXTRA_INFO_KEYS
        assert info["split"] == spec.role and info["index"] == i and info["problem"] == problem
        assert info["raw_answer"] is not None


def test_extra_info_keeps_useful_originals():
    math500 = load_rows(get_spec("math500"), fixture("math500"))[0]["extra_info"]
    assert (math500["level"], math500["subject"], math500["source_id"]) == ("2", "Precalculus",
                                                                            "test/precalculus/807.json")
    assert math500["solution"].startswith("We have that $r = ")
    olympiad = load_rows(get_spec("olympiadbench"), fixture("olympiadbench"))
    assert [r["extra_info"]["subject"] for r in olympiad] == ["Number Theory", "Combinatorics", "Algebra"]
    assert olympiad[2]["extra_info"]["raw_answer"] == '["$2$", "$3$"]'
    aime24 = load_rows(get_spec("aime24"), fixture("aime24"))[0]["extra_info"]
    assert aime24["source_id"] == "60" and aime24["level"] is None
    amc = load_rows(get_spec("amc23"), fixture("amc23"))[0]["extra_info"]
    assert amc["raw_answer"] == "27.0" and amc["source_id"] == "0"
    minerva = load_rows(get_spec("minerva"), fixture("minerva"))[0]["extra_info"]
    assert minerva["solution"] is None and minerva["source_id"] is None


@pytest.mark.parametrize(
    ("value", "strip", "expected"),
    [
        (None, True, ""),
        (float("nan"), True, ""),
        ("  42 ", False, "42"),
        ("$x$", False, "$x$"),  # only stripped when the spec asks
        ("  $\\frac{1}{2}$ ", True, "\\frac{1}{2}"),
        ("$$5$$", True, "5"),
        ("$x$ or $y$", True, "$x$ or $y$"),  # not one whole-answer wrap
        ("$5", True, "$5"),
        (27.0, False, "27"),
        (2.5, False, "2.5"),
        (7, False, "7"),
        ([], True, ""),
        (["$a$"], True, "a"),
        (["$a$", "", " $b$ "], True, "a, b"),
        (np.array(["$1$", "$2$"], dtype=object), True, "1, 2"),  # lists read back from parquet
    ],
)
def test_normalize_answer(value, strip, expected):
    assert normalize_answer(value, strip_dollars=strip) == expected


def test_rows_with_empty_answers_are_dropped_and_reported(tmp_path, capsys):
    raw = [
        {"problem": "p0", "answer": "1"},
        {"problem": "p1", "answer": ""},
        {"problem": "p2", "answer": None},
        {"problem": "p3", "answer": "  "},
        {"problem": "p4", "answer": "$ $"},
        {"problem": "  ", "answer": "5"},
        {"problem": "p6", "answer": "6"},
    ]
    spec = get_spec("deepscaler")
    rows, dropped = convert_rows(spec, raw)
    assert dropped == [1, 2, 3, 4, 5]
    assert [(r["extra_info"]["index"], r["reward_model"]["ground_truth"]) for r in rows] == [(0, "1"), (6, "6")]

    src = tmp_path / "deepscaler.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in raw))
    summary = prepare(spec, source=src, out_dir=tmp_path / "out")
    assert (summary.rows_read, summary.rows_dropped, summary.rows_written) == (7, 5, 2)
    assert pq.read_table(summary.path).num_rows == 2
    out = capsys.readouterr().out
    assert "dropping 5 row(s)" in out and "wrote 2 rows to" in out and str(summary.path) in out


def test_missing_column_lists_what_the_source_has(tmp_path):
    src = tmp_path / "amc.jsonl"
    src.write_text(json.dumps({"problem": "p", "answer": 1}) + "\n")  # amc23 asks "question"
    with pytest.raises(KeyError, match=r"no column\(s\) \['question'\].*'answer', 'problem'"):
        load_rows(get_spec("amc23"), src)


def test_local_formats_read_the_same_rows(tmp_path):
    import pyarrow as pa

    raw = fixture_rows("math500")
    (tmp_path / "list.json").write_text(json.dumps(raw))
    (tmp_path / "lines.json").write_text(fixture("math500").read_text())  # datasets' to_json writes lines
    pq.write_table(pa.Table.from_pylist(raw), tmp_path / "t.parquet")
    spec = get_spec("math500")
    expected = load_rows(spec, fixture("math500"))
    for name in ("list.json", "lines.json", "t.parquet"):
        assert read_local_file(tmp_path / name) == raw
        assert load_rows(spec, tmp_path / name) == expected
    with pytest.raises(FileNotFoundError, match="source file not found"):
        load_rows(spec, tmp_path / "missing.jsonl")


def test_output_is_deterministic_and_round_trips(tmp_path):
    spec = get_spec("olympiadbench")
    a = prepare(spec, source=fixture("olympiadbench"), out_dir=tmp_path / "a").path
    b = prepare(spec, source=fixture("olympiadbench"), out_dir=tmp_path / "b").path
    assert a.read_bytes() == b.read_bytes()
    assert pq.read_table(a).to_pylist() == load_rows(spec, fixture("olympiadbench"))
    limited = prepare(spec, source=fixture("olympiadbench"), out_dir=tmp_path / "c", limit=2)
    assert limited.rows_written == 2 and pq.read_table(limited.path).to_pylist() == pq.read_table(a).to_pylist()[:2]


def test_every_file_has_the_same_schema(tmp_path):
    schemas = {to_parquet(load_rows(get_spec(n), fixture(n)), tmp_path / f"{n}.parquet").name:
               pq.read_schema(tmp_path / f"{n}.parquet") for n in NAMES}
    first = next(iter(schemas.values()))
    assert all(s.equals(first) for s in schemas.values())


# --- verl loads the output -----------------------------------------------------------------------


def test_verl_rlhf_dataset_loads_all_files_together(tmp_path):
    files = [str(prepare(get_spec(n), source=fixture(n), out_dir=tmp_path / "math").path) for n in NAMES]
    ds = load_with_verl(files, tmp_path, max_prompt_length=1024)
    assert len(ds) == sum(len(v) for v in EXPECTED_GROUND_TRUTH.values())
    by_source = {}
    for i in range(len(ds)):
        item = ds[i]
        by_source.setdefault(item["data_source"], []).append(item)
        assert item["raw_prompt"][0]["role"] == "user" and item["raw_prompt"][0]["content"].endswith(INSTRUCTION)
        assert item["index"] == item["extra_info"]["index"]
    assert list(by_source) == list(NAMES)
    for name, items in by_source.items():
        assert [it["reward_model"]["ground_truth"] for it in items] == EXPECTED_GROUND_TRUTH[name]
    assert by_source["math500"][0]["extra_info"]["level"] == "2"


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_end_to_end_on_a_fixture(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gapo.data.prepare_math", "--dataset", "aime24", "--source", str(fixture("aime24")),
         "--out", str(tmp_path), "--limit", "2"],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 2 rows to {tmp_path / 'aime24.parquet'}" in proc.stdout
    rows = pq.read_table(tmp_path / "aime24.parquet").to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["204", "25"]


def test_cli_all_from_a_directory(tmp_path, capsys):
    summaries = cli_main(["--dataset", "all", "--source", str(FIXTURES), "--out", str(tmp_path)])
    assert [s.data_source for s in summaries] == list(NAMES)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.parquet" for n in NAMES)
    assert "done: 25 rows in 8 files" in capsys.readouterr().out


def test_cli_unknown_dataset_lists_valid_names(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["--dataset", "gsm8k"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'gsm8k'" in err
    assert all(n in err for n in (*NAMES, "all"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "aime24", "--source", "nowhere/aime24.jsonl"], "error: source file not found: nowhere/aime24.jsonl"),
        (["--dataset", "all", "--source", "nowhere.jsonl"], "error: with --dataset all, --source must be a directory"),
    ],
)
def test_cli_missing_file_is_a_clear_error(argv, message, tmp_path):
    with pytest.raises(SystemExit) as exc:
        cli_main([*argv, "--out", str(tmp_path)])
    assert str(exc.value.code).startswith(message)
    assert not list(tmp_path.iterdir())


def test_cli_all_with_a_directory_missing_one_file(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "deepscaler.jsonl").write_text(fixture("deepscaler").read_text())
    with pytest.raises(SystemExit) as exc:
        cli_main(["--dataset", "all", "--source", str(tmp_path / "src"), "--out", str(tmp_path / "out")])
    assert "no aime24{.jsonl,.json,.parquet} in source directory" in str(exc.value.code)


def test_cli_offline_hub_tells_to_pass_source(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [sys.executable, "-m", "gapo.data.prepare_math", "--dataset", "aime24", "--out", str(tmp_path / "out")],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert "could not load 'HuggingFaceH4/aime_2024'" in proc.stderr
    assert "--source PATH" in proc.stderr
    assert not (tmp_path / "out").exists()
