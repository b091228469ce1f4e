"""`python -m recipe.reproduce`: each table's runs and commands (dry run), their validation, submission through a
stand-in for launch/submit.sh, and the filled table from evaluation summaries, on CPU without Ray."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from eval.report import summarize_run
from recipe.reproduce import TABLES, cluster_overrides, main, plan
from tests.test_experiment_configs import EXPERIMENTS, _compose, validate_for_verl


def _listed(table):
    return [run for row in TABLES[table].rows for run in row.runs]


def test_every_experiment_config_is_in_a_table_and_every_evaluation_has_its_own_folder():
    listed = {run for table in TABLES for run in _listed(table)}
    assert listed == set(EXPERIMENTS)
    folders = {}
    for table in TABLES.values():
        for row in table.rows:  # rows sharing a folder must be the same evaluation (same run, same benchmarks)
            key = (row.runs or row.model, table.benches, row.eval_args)
            assert folders.setdefault(row.eval_name, key) == key, row.eval_name


@pytest.mark.parametrize("table", sorted(TABLES))
def test_dry_run_prints_every_runs_command_and_evaluation(table, capsys, monkeypatch):
    monkeypatch.delenv("CKPT_ROOT", raising=False)
    assert main([table, "--no-check", "--nodes", "2", "--gpus-per-node", "4", "trainer.total_epochs=3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    train = [shlex.split(line) for line in lines if line.startswith("python -m recipe.main_gapo")]
    evals = [shlex.split(line) for line in lines if line.startswith("python -m eval")]
    assert [cmd[4] for cmd in train] == _listed(table)  # every run, in order: --config-name X
    for cmd in train:
        assert cmd[5:8] == ["trainer.nnodes=2", "trainer.n_gpus_per_node=4", "trainer.total_epochs=3"]
    assert len(evals) == len(TABLES[table].rows)
    for row, cmd in zip(TABLES[table].rows, evals):
        assert cmd[cmd.index("--out") + 1] == f"runs/eval/{row.eval_name}"


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_listed_run_resolves_and_passes_verls_validation(table):
    planned = plan(TABLES[table], cluster_overrides(1, 8), [], ckpt_root="/shared/ckpt", check=False)
    jobs = [job for _, row_jobs in planned for job in row_jobs]
    assert [job.config for job in jobs] == _listed(table)
    for job in jobs:
        cfg = _compose(job.config, job.overrides)
        validate_for_verl(cfg)
        assert cfg.trainer.default_local_dir == f"/shared/ckpt/{cfg.trainer.project_name}/{job.config.split('/')[1]}"
        if job.after:  # a later stage starts from the previous stage's exported model
            prev = next(j for j in jobs if j.config == job.after)
            assert cfg.actor_rollout_ref.model.path == f"{prev.checkpoint_dir}/merged_hf"


def test_reproduce_validates_at_four_nodes(capsys):
    assert main(["code", "--nodes", "4", "--gpus-per-node", "8"]) == 0
    assert "--config-name code/r1_1.5b_gapo_token_32k trainer.nnodes=4" in capsys.readouterr().out


@pytest.fixture
def fake_submit(tmp_path, monkeypatch):
    """A stand-in for launch/submit.sh that records its arguments (one JSON list per call)."""
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "submit.sh"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                      "sys.exit(1 if 'fail' in ' '.join(sys.argv) else 0)\n")
    script.chmod(0o755)
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    return script, lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_submit_calls_the_submit_script_for_each_first_stage_run(fake_submit, capsys):
    script, calls = fake_submit
    assert main(["code", "--submit", "--no-check", "--ckpt-root", "/shared/ckpt", "--submit-script", str(script)]) == 0
    cluster = ["trainer.nnodes=1", "trainer.n_gpus_per_node=8"]
    assert calls() == [
        ["--no-wait", "code/r1_1.5b_deepcoder", *cluster,
         "trainer.default_local_dir=/shared/ckpt/gapo_code/r1_1.5b_deepcoder"],
        ["--no-wait", "code/r1_1.5b_gapo_token", *cluster,
         "trainer.default_local_dir=/shared/ckpt/gapo_code/r1_1.5b_gapo_token"],
    ]
    out = capsys.readouterr().out
    assert "skipped code/r1_1.5b_deepcoder_32k: starts from code/r1_1.5b_deepcoder's model" in out


def test_submit_only_a_later_stage_passes_the_previous_stages_model(fake_submit):
    script, calls = fake_submit
    assert main(["code", "--submit", "--no-check", "--ckpt-root", "/shared/ckpt", "--submit-script", str(script),
                 "--only", "code/r1_1.5b_deepcoder_32k"]) == 0
    [call] = calls()
    assert call[1] == "code/r1_1.5b_deepcoder_32k"
    assert "actor_rollout_ref.model.path=/shared/ckpt/gapo_code/r1_1.5b_deepcoder/merged_hf" in call


def test_submit_skips_runs_of_another_table(fake_submit, capsys):
    script, calls = fake_submit
    assert main(["ablation", "--submit", "--no-check", "--ckpt-root", "/c", "--submit-script", str(script)]) == 0
    submitted = [call[1] for call in calls()]
    assert "math/r1_1.5b_gapo" not in submitted and "math/r1_1.5b_gapo_k4" in submitted
    assert "math/r1_1.5b_gapo_stage2_16k" not in submitted and "math/r1_1.5b_gapo_stage1_8k" in submitted
    assert "skipped math/r1_1.5b_gapo: trained by table math" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--ckpt-root", "/c"], {}, "RAY_ADDRESS is not set"),
    ([], {"RAY_ADDRESS": "http://h:8265"}, "--submit needs --ckpt-root"),
    (["--ckpt-root", "rel/ckpt"], {"RAY_ADDRESS": "http://h:8265"}, "absolute path"),
    (["--ckpt-root", "/c", "--only", "code/nope"], {"RAY_ADDRESS": "http://h:8265"}, "not a run of table 'code'"),
    (["--ckpt-root", "/c", "trainer.project_name=fail"], {"RAY_ADDRESS": "http://h:8265"},
     "failed for code/r1_1.5b_deepcoder"),
])
def test_submit_errors_name_the_bad_value_and_the_fix(args, env, message, fake_submit, monkeypatch, capsys):
    script, _ = fake_submit
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("CKPT_ROOT", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["code", "--submit", "--no-check", "--submit-script", str(script), *args]) == 2
    assert message in capsys.readouterr().err


def _write_summary(root: Path, name: str, solved: dict[str, list[int]], n: int = 16):
    """A real summary.json (eval.report.summarize_run) where bench's problems have the given correct counts."""
    done = {(bench, f"p{i}"): [{"correct": s < c} for s in range(n)]
            for bench, counts in solved.items() for i, c in enumerate(counts)}
    benchmarks = {bench: {"path": f"{bench}.parquet", "problems_total": len(counts)}
                  for bench, counts in solved.items()}
    summary = summarize_run(done, {"n": n, "label": name}, benchmarks)
    (root / name).mkdir(parents=True)
    (root / name / "summary.json").write_text(json.dumps(summary))


def _cells(markdown: str) -> dict[str, list[str]]:
    rows = [line.strip("|").split("|") for line in markdown.splitlines() if line.startswith("| ")]
    return {cells[1].strip().strip("`"): [c.strip() for c in cells[2:]] for cells in rows[1:]}


def test_fill_puts_each_number_in_its_cell(tmp_path, capsys):
    # pass@1 = mean of c / 16 over problems: 4/16 -> 25.0, 8/16 -> 50.0, ...
    _write_summary(tmp_path, "base_deepseek-r1-distill-qwen-1.5b_code", {"livecodebench": [2], "humanevalplus": [10]})
    _write_summary(tmp_path, "r1_1.5b_deepcoder_32k", {"livecodebench": [4], "humanevalplus": [11]})
    _write_summary(tmp_path, "r1_1.5b_gapo_token_32k", {"livecodebench": [4, 5], "humanevalplus": [12]})
    assert main(["code", "--fill", "--eval-root", str(tmp_path)]) == 0
    cells = _cells(capsys.readouterr().out)
    assert cells["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"] == ["12.5 (16.9)", "62.5 (58.3)"]
    assert cells["r1_1.5b_deepcoder_32k"] == ["25.0 (22.4)", "68.8 (68.2)"]
    assert cells["r1_1.5b_gapo_token_32k"] == ["28.1 (24.8)", "75.0 (71.7)"]


def test_fill_math_pass_at_16_and_blank_paper_numbers(tmp_path, capsys):
    names = [row.eval_name for row in TABLES["math"].rows]
    for name in names:
        _write_summary(tmp_path, name, {b: [1, 0] for b in ("aime24", "aime25", "amc23", "amc22_23", "math500",
                                                             "minerva", "olympiadbench")})
    assert main(["math", "--fill", "--eval-root", str(tmp_path)]) == 0
    cells = _cells(capsys.readouterr().out)
    # one problem solved once in 16, one never: pass@1 = 3.1, pass@16 = 50.0
    assert cells["r1_1.5b_gapo"][:4] == ["3.1 (44.0)", "50.0 (76.7)", "3.1 (30.8)", "50.0 (56.7)"]
    assert cells["r1_1.5b_focal_gspo"][:3] == ["3.1 (40.2)", "50.0 (73.3)", "3.1"]
    assert cells["r1_1.5b_grpo"] == ["3.1", "50.0"] * 2 + ["3.1"] * 5  # not reported by the paper: no number


def test_fill_without_a_summary_names_it_and_the_fix(tmp_path, capsys):
    _write_summary(tmp_path, "r1_1.5b_deepcoder_32k", {"livecodebench": [4], "humanevalplus": [11]})
    assert main(["code", "--fill", "--eval-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "r1_1.5b_gapo_token_32k" / "summary.json") in err
    assert "python -m eval" in err and "--allow-missing" in err
    assert main(["code", "--fill", "--eval-root", str(tmp_path), "--allow-missing"]) == 0
    cells = _cells(capsys.readouterr().out)
    assert cells["r1_1.5b_gapo_token_32k"] == ["- (24.8)", "- (71.7)"]
    assert cells["r1_1.5b_deepcoder_32k"] == ["25.0 (22.4)", "68.8 (68.2)"]


def test_fill_with_a_benchmark_missing_from_a_summary_names_it(tmp_path, capsys):
    for name in ("base_deepseek-r1-distill-qwen-1.5b_code", "r1_1.5b_deepcoder_32k", "r1_1.5b_gapo_token_32k"):
        _write_summary(tmp_path, name, {"livecodebench": [4]})
    assert main(["code", "--fill", "--eval-root", str(tmp_path)]) == 2
    assert "no pass@1 on humanevalplus" in capsys.readouterr().err


def test_a_bad_override_names_the_run_and_the_override(capsys):
    assert main(["code", "--no-check", "trainer.no_such_key=1"]) == 2
    err = capsys.readouterr().err
    assert "code/r1_1.5b_deepcoder does not compose" in err and "trainer.no_such_key=1" in err


def test_unknown_table_names_it_and_the_choices(capsys):
    assert main(["nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown table 'nope'" in err and "math, code, ablation" in err


def test_math_evaluations_sample_enough_for_coverage_and_qwen_llama_reach_pass_at_256(capsys, monkeypatch):
    """n = 64 for every math row (coverage above a 5% solve rate is degenerate at eval's default 16), 256 for the
    Qwen and Llama rows (their evaluations report up to pass@256), one --n each; both AMC sets, and the code table
    keeps eval's defaults."""
    monkeypatch.delenv("CKPT_ROOT", raising=False)
    for table in ("math", "ablation", "code"):
        assert main([table, "--no-check"]) == 0
        evals = [shlex.split(line) for line in capsys.readouterr().out.splitlines()
                 if line.startswith("python -m eval")]
        for row, cmd in zip(TABLES[table].rows, evals):
            assert cmd.count("--n") == (0 if table == "code" else 1), cmd
            if table == "code":
                continue
            n = cmd[cmd.index("--n") + 1]
            assert n == ("256" if row.label.startswith(("Qwen", "Llama")) else "64"), row.label
            benches = cmd[cmd.index("--bench") + 1:cmd.index("--out")]
            assert {"amc23", "amc22_23"} <= set(benches)
