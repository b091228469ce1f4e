"""recipe/plot_run.py: training curves from a run's local metrics files (verl's file logger, W&B run logs).

Fast tests on constructed files (two runs, a resumed run's merge, missing panels, bad paths, a real offline W&B run
read back with the values it logged); one slow test on the metrics files of a real smoke run (tests/conftest.py)."""

import json
import os
import time
from pathlib import Path

import pytest

from recipe.plot_run import (
    CORR_KEYS,
    REWARD_KEY,
    MetricsNotFound,
    build_panels,
    hf_trainer_steps,
    load_run,
    main,
    parse_steps,
    plot_runs,
    read_file_logger,
    wandb_records,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_log(path: Path, records: list[tuple[int, dict]], mtime: float | None = None) -> Path:
    """A metrics file as verl's FileLogger writes it: one ``{"step": N, "data": {...}}`` per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in records))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def step_metrics(clip: dict[int, float], dev: dict[int, float] | None = None, reward: float | None = None,
                 **extra) -> dict:
    out = {f"gapo/clipfrac_pos/c{c}": v for c, v in clip.items()}
    out.update({f"gapo/ratio_dev_pos/c{c}": v for c, v in (dev or {}).items()})
    if reward is not None:
        out["critic/score/mean"] = reward
    return {**out, **extra}


def lines_of(result: dict, title_start: str) -> dict[tuple[str, str], dict[int, float]]:
    """{(run, key): {step: value}} of the drawn panel whose title starts with ``title_start``."""
    panel = next(p for p in result["panels"] if p.title.startswith(title_start))
    return {(ln.run, ln.key): dict(zip(ln.steps, ln.values, strict=True)) for ln in panel.lines}


def assert_png(path: Path):
    assert path.is_file() and path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


# ------------------------------------------------------------------ verl's file logger
def test_reads_what_verls_file_logger_writes(tmp_path, monkeypatch):
    """The record shape is verl's own (FileLogger, orjson with numpy): numpy scalars read back, NaN (null) and
    non-numbers are left out."""
    import numpy as np
    from verl.utils.tracking import FileLogger

    path = tmp_path / "m.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = FileLogger("proj", "exp")
    logger.log({"gapo/clipfrac_pos/c1": np.float32(0.25), "critic/score/mean": 0.5, "training/x": float("nan"),
                "val-aux/name": "text", "timing_s/step": np.int64(3)}, step=1)
    logger.log({"gapo/clipfrac_pos/c1": 0.125}, step=2)
    logger.finish()
    assert read_file_logger(path) == {1: {"gapo/clipfrac_pos/c1": 0.25, "critic/score/mean": 0.5,
                                          "timing_s/step": 3.0},
                                      2: {"gapo/clipfrac_pos/c1": 0.125}}


def test_two_runs_side_by_side(tmp_path):
    a = tmp_path / "gapo_run"
    write_log(a / "logs" / "run1.jsonl", [
        (1, step_metrics({1: 0.5, 2: 0.25}, {1: 0.04, 2: 0.03}, 0.40, **{
            "val-passk/aime/pass@1": 0.1, "val-passk/aime/pass@2": 0.15, "val-passk/aime/coverage@5%": 3.0,
            "val-passk/aime/coverage_frac@5%": 0.2, "val-passk-window/aime/pass@1/mean": 0.1})),
        (2, step_metrics({1: 0.375, 2: 0.125}, {1: 0.05, 2: 0.02}, 0.45, **{
            "gapo/is_adv_corr": 0.9, "gapo/is_adv_corr_window": 0.7, "gapo/explore/entropy_success": 1.5,
            "gapo/explore/entropy_failure": 2.5, "gapo/explore/entrance_distinct": 0.625,
            "gapo/explore/entrance_unique_success": 0.5, "gapo/explore/entrance_distinct/c1": 0.25,
            "gapo/explore/coverage_frac": 0.75, "gapo/explore/coverage_window_frac": 0.8})),
        (3, step_metrics({1: 0.25}, {1: 0.06}, 0.5, **{"val-passk/aime/pass@1": 0.2, "val-passk/aime/pass@2": 0.3,
                                                     "val-passk/aime/coverage_frac@5%": 0.4})),
    ])
    b = write_log(tmp_path / "baseline.jsonl", [
        (1, step_metrics({1: 0.1, 3: 0.2}, {1: 0.01, 3: 0.02}, 0.3)),
        (2, step_metrics({3: 0.3}, {3: 0.03}, 0.35, **{"gapo/explore/entrance_distinct": 0.875})),
    ])
    # verl's rollout dump in the same folder: not a metrics file, ignored
    (a / "rollouts").mkdir()
    (a / "rollouts" / "1.jsonl").write_text(json.dumps({"input": "q", "output": "a", "score": 1.0, "step": 1}) + "\n")
    printed = []
    result = plot_runs([a, b], tmp_path / "fig" / "curves.png", labels=["gapo", "grpo"], echo=printed.append)

    assert_png(result["out"])
    assert [r.label for r in result["runs"]] == ["gapo", "grpo"]
    assert [r.files for r in result["runs"]] == [[a / "logs" / "run1.jsonl"], [b]]
    clip = lines_of(result, "clip fraction")
    assert clip == {("gapo", "c1"): {1: 0.5, 2: 0.375, 3: 0.25}, ("gapo", "c2"): {1: 0.25, 2: 0.125},
                    ("grpo", "c1"): {1: 0.1}, ("grpo", "c3"): {1: 0.2, 2: 0.3}}
    dev = lines_of(result, "mean |ratio - 1|")
    assert dev[("gapo", "c2")] == {1: 0.03, 2: 0.02} and dev[("grpo", "c3")] == {1: 0.02, 2: 0.03}
    assert lines_of(result, "reward") == {("gapo", ""): {1: 0.4, 2: 0.45, 3: 0.5}, ("grpo", ""): {1: 0.3, 2: 0.35}}
    # validation: pass@k per k and the coverage fraction (not the count, not the window averages), run a only
    assert lines_of(result, "validation: aime") == {
        ("gapo", "pass@1"): {1: 0.1, 3: 0.2}, ("gapo", "pass@2"): {1: 0.15, 3: 0.3},
        ("gapo", "coverage_frac@5%"): {1: 0.2, 3: 0.4}}
    # the correlation: step and window, where logged (step 2 of run a; run b has none)
    assert lines_of(result, "corr(") == {("gapo", "step"): {2: 0.9}, ("gapo", "window"): {2: 0.7}}
    # the exploration instruments: the overall values, one line per (run, which); per-c values are not drawn
    assert lines_of(result, "entropy of the rollouts") == {("gapo", "successes"): {2: 1.5},
                                                           ("gapo", "failures"): {2: 2.5}}
    assert lines_of(result, "entrance diversity") == {("gapo", "distinct / k"): {2: 0.625},
                                                      ("gapo", "unique successes"): {2: 0.5},
                                                      ("grpo", "distinct / k"): {2: 0.875}}
    assert lines_of(result, "live coverage") == {("gapo", "this step"): {2: 0.75}, ("gapo", "window"): {2: 0.8}}
    assert result["skipped"] == []
    text = "\n".join(printed)
    assert "gapo: 3 steps (1..3) from file logger logs/run1.jsonl" in text
    assert "grpo: 2 steps (1..2)" in text
    assert "panel: clip fraction by c" in text and "[c1 c2 c3]" in text
    assert "panel: validation: aime [pass@1 pass@2 coverage_frac@5%]" in text
    assert f"wrote {tmp_path / 'fig' / 'curves.png'}" in text


def test_resumed_run_merges_by_step_later_file_wins(tmp_path):
    """A run killed after logging step 3 (before its checkpoint), resumed from step 2: the second launch logs its
    validation before training at step 2 and redoes step 3. Per (step, metric), the later file wins."""
    run = tmp_path / "run"
    now = time.time()
    first = write_log(run / "logs" / "run1.jsonl", [
        (1, step_metrics({1: 0.1}, reward=0.1)),
        (2, step_metrics({1: 0.2}, reward=0.2)),
        (3, step_metrics({1: 0.9}, reward=0.9)),
    ], mtime=now - 100)
    with open(first, "a") as fp:  # killed mid-write: a truncated last line
        fp.write('{"step": 4, "data": {"gapo/clip')
    os.utime(first, (now - 100, now - 100))
    write_log(run / "logs" / "run2.jsonl", [
        (2, {"val-passk/src/pass@1": 0.5}),
        (3, step_metrics({1: 0.3}, reward=0.3)),
        (4, step_metrics({1: 0.4}, reward=0.4)),
    ], mtime=now)
    loaded = load_run(run)
    assert sorted(loaded.steps) == [1, 2, 3, 4]
    assert loaded.steps[2] == {"gapo/clipfrac_pos/c1": 0.2, "critic/score/mean": 0.2, "val-passk/src/pass@1": 0.5}
    assert loaded.steps[3]["gapo/clipfrac_pos/c1"] == 0.3 and loaded.steps[3]["critic/score/mean"] == 0.3
    notes = "\n".join(loaded.notes)
    assert "2 files merged by step, in order of modification time (later wins): logs/run1.jsonl (steps 1-3), " \
           "logs/run2.jsonl (steps 2-4)" in notes
    assert "step 3 logged in several files: the later file's values kept (2 metric(s) from run2.jsonl)" in notes
    assert "skipped a truncated last line" in notes
    # the order is the files' modification time, not their names
    os.utime(first, (now + 100, now + 100))
    assert load_run(run).steps[3]["gapo/clipfrac_pos/c1"] == 0.9


def test_missing_panels_are_noted_not_fatal(tmp_path, capsys):
    path = write_log(tmp_path / "reward_only.jsonl", [(1, {"critic/score/mean": 0.2}), (2, {"critic/score/mean": 0.3})])
    main([str(path), "--out", str(tmp_path / "f.png")])
    out = capsys.readouterr().out
    assert_png(tmp_path / "f.png")
    assert "panel skipped: clip fraction by c (positive-advantage successes): no run logged gapo/clipfrac_pos/c<c>" \
        in out
    assert "panel skipped: mean |ratio - 1| by c" in out
    assert "panel skipped: correlation: no run logged gapo/is_adv_corr or gapo/is_adv_corr_window" in out
    assert "panel skipped: entrance diversity (first moves): no run logged gapo/explore/entrance_distinct or " \
        "gapo/explore/entrance_unique_success" in out
    assert "panel skipped: validation pass@k: no run logged val-passk/<source>/pass@<k>" in out
    assert "panel: reward (critic/score/mean)" in out
    # a run that has none of the plotted quantities: a clear error, no figure
    other = write_log(tmp_path / "timing.jsonl", [(1, {"timing_s/step": 3.0})])
    with pytest.raises(SystemExit) as exc:
        main([str(other), "--out", str(tmp_path / "g.png")])
    assert "nothing to plot" in str(exc.value.code) and not (tmp_path / "g.png").exists()


def test_steps_range_and_labels(tmp_path):
    path = write_log(tmp_path / "m.jsonl", [(s, step_metrics({1: s / 10}, reward=s / 10)) for s in range(1, 6)])
    result = plot_runs([path], tmp_path / "f.png", steps=(2, 4), echo=lambda _: None)
    assert lines_of(result, "clip fraction") == {("m", "c1"): {2: 0.2, 3: 0.3, 4: 0.4}}
    assert parse_steps("2:4") == (2, 4) and parse_steps(":4") == (None, 4) and parse_steps("10:") == (10, None)
    for bad in ("4", "a:b", "5:2"):
        with pytest.raises(Exception, match="--steps"):
            parse_steps(bad)
    with pytest.raises(SystemExit) as exc:
        main([str(path), "--out", str(tmp_path / "g.png"), "--steps", "50:60"])
    assert "no run has a step in --steps 50:60" in str(exc.value.code)
    with pytest.raises(SystemExit) as exc:
        main([str(path), str(path), "--out", str(tmp_path / "g.png"), "--labels", "one"])
    assert "--labels: 1 label(s) for 2 run(s)" in str(exc.value.code)
    # the same run twice: distinct legend names
    result = plot_runs([path, path], tmp_path / "h.png", echo=lambda _: None)
    assert [r.label for r in result["runs"]] == ["m", "m (2)"]


def test_bad_paths_say_what_was_looked_for(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(SystemExit) as exc:
        main([str(missing), "--out", str(tmp_path / "f.png")])
    message = str(exc.value.code)
    assert str(missing) in message and "no such file or folder" in message
    assert "verl file-logger files" in message and "VERL_FILE_LOGGER_PATH" in message and "run-*.wandb" in message

    empty = tmp_path / "empty"
    (empty / "rollouts").mkdir(parents=True)
    (empty / "rollouts" / "1.jsonl").write_text(json.dumps({"input": "q", "step": 1}) + "\n")
    with pytest.raises(MetricsNotFound) as err:
        load_run(empty)
    assert str(empty) in str(err.value) and "no metrics found" in str(err.value)
    assert "1 other .jsonl file(s) there are not in that format" in str(err.value)

    not_metrics = tmp_path / "samples.jsonl"
    not_metrics.write_text('{"problem": 1}\n')
    with pytest.raises(MetricsNotFound, match="not a verl file-logger metrics file nor a W&B run log"):
        load_run(not_metrics)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"step": 1, "data": {}}\nnot json\n{"step": 2, "data": {}}\n')
    with pytest.raises(ValueError, match="line 2: not a verl file-logger record"):
        load_run(broken)


def test_a_folder_without_metrics_says_how_to_get_some(tmp_path):
    """What each producer needs to write metrics plot-run reads: verl's file logger or W&B (offline), make smoke-trl's
    file, a TRL run's callback; the same advice for a missing folder."""
    advice = ("trainer.logger includes 'file'", "VERL_FILE_LOGGER_PATH", "'wandb'", "WANDB_MODE=offline",
              "make smoke-trl writes OUT/logs/metrics.jsonl", "gapo.integrations.trl.MetricsFileCallback")
    empty = tmp_path / "smoke-trl"
    (empty / "trainer").mkdir(parents=True)  # what make smoke-trl left before it kept metrics
    for path, what in ((empty, "no metrics found"), (tmp_path / "absent", "no such file or folder")):
        with pytest.raises(SystemExit) as exc:
            main([str(path), "--out", str(tmp_path / "f.png")])
        message = str(exc.value.code)
        assert what in message and all(needed in message for needed in advice), message


def test_a_trl_runs_file_draws_its_reward(tmp_path):
    """A TRL run's file (gapo.integrations.trl.MetricsFileCallback: TRL's names) draws TRL's `reward` in the reward
    panel, as its W&B run does; a verl run's own critic/score/mean is never replaced."""
    trl = write_log(tmp_path / "trl" / "logs" / "metrics.jsonl", [
        (1, {**step_metrics({2: 0.5}), "reward": 0.25, "reward_std": 0.1}),
        (2, step_metrics({2: 0.0})),
    ])
    verl = write_log(tmp_path / "verl" / "m.jsonl", [(1, {**step_metrics({1: 0.5}, reward=0.75), "reward": 0.1})])
    result = plot_runs([trl.parent.parent, verl], tmp_path / "f.png", labels=["trl", "verl"], echo=lambda *_: None)
    assert lines_of(result, "reward") == {("trl", ""): {1: 0.25}, ("verl", ""): {1: 0.75}}


# ------------------------------------------------------------------ W&B run logs
@pytest.fixture
def wandb_service():
    """W&B's background service (wandb-core) is shut down after the test: no process of it outlives the test."""
    import wandb

    yield
    wandb.teardown()


def wandb_offline_run(root: Path, run_id: str, name: str, steps: dict[int, dict]) -> Path:
    """A real offline W&B run (no network): ``wandb.log(data, step=N)`` as verl's tracking does. Returns its folder."""
    import wandb

    run = wandb.init(mode="offline", dir=str(root), project="gapo-plot-test", id=run_id, name=name,
                     settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_machine_info=True,
                                             disable_git=True, silent=True))
    for step, data in steps.items():
        run.log(data, step=step)
    run.finish()
    # finish() can return before wandb-core has written the log's last records (seen on a busy machine): stop
    # the service, then wait for the log's closing `exit` record
    wandb.teardown()
    folders = [p for p in (root / "wandb").glob(f"offline-run-*-{run_id}") if p.is_dir()]
    folder = max(folders, key=lambda p: p.stat().st_mtime)
    wait_for_exit_record(next(folder.glob("run-*.wandb")))
    return folder


def wait_for_exit_record(log: Path, timeout_s: float = 30) -> None:
    """Wait until a finished W&B run's log holds its closing `exit` record (call after wandb.teardown())."""
    deadline = time.monotonic() + timeout_s
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(log)):
        assert time.monotonic() < deadline, f"{log} has no exit record {timeout_s:g} s after wandb's finish()"
        time.sleep(0.2)


def test_hugging_face_trainer_runs_are_read_at_their_optimizer_step():
    """TRL's W&B runs: train/<name> beside train/global_step, one W&B step per log call; evaluation left out."""
    steps = {0: {"train/global_step": 1, "train/gapo/clipfrac_pos/c1": 0.5, "train/reward": 0.25, "train/loss": 0.1},
             1: {"train/global_step": 2, "train/gapo/clipfrac_pos/c1": 0.0, "train/loss": 0.2},
             2: {"train/global_step": 2, "eval/gapo/clipfrac_pos/c1": 0.75},
             3: {"train/global_step": 2, "train/train_runtime": 3.0},
             4: {"train/global_step": 0}}
    assert hf_trainer_steps(steps) == {1: {"gapo/clipfrac_pos/c1": 0.5, REWARD_KEY: 0.25, "loss": 0.1},
                                       2: {"gapo/clipfrac_pos/c1": 0.0, "loss": 0.2, "train_runtime": 3.0}}
    verl = {5: {"critic/score/mean": 0.5, "gapo/clipfrac_pos/c1": 0.1}}
    assert hf_trainer_steps(verl) is verl


@pytest.mark.usefixtures("wandb_service")
def test_wandb_offline_run_reads_back_what_was_logged(tmp_path):
    logged = {
        1: step_metrics({1: 0.5, 4: 0.125}, {1: 0.031, 4: 0.0625}, 0.4375, **{"actor/pg_clipfrac": 0.2,
                                                                           "val-passk/aime/pass@1": 0.1}),
        2: step_metrics({1: 0.3, 4: 0.7}, {1: 0.017, 4: 0.09}, 0.5, **{"timing_s/step": 12}),
        3: step_metrics({2: 1 / 3}, {2: 0.123456789}, 0.59375),
    }
    # enough steps for a log of several 32 KiB blocks (records cut at block ends), and one step of ~100 KB (a
    # record in several pieces)
    for step in range(4, 204):
        logged[step] = step_metrics({c: (step * c % 97) / 97 for c in range(1, 9)},
                                    {c: (step + c) / 1000 for c in range(1, 9)}, step / 256)
    logged[300] = {f"extra/metric_{i}": i / 7 for i in range(2000)}
    folder = wandb_offline_run(tmp_path, "gapotest1", "gapo-offline", logged)
    files = list(folder.glob("run-*.wandb"))
    assert len(files) == 1 and files[0].stat().st_size > 4 * 32768
    # the run folder, its .wandb file, the wandb folder and the folder holding it: the same run, the same values
    for path in (folder, files[0], tmp_path / "wandb", tmp_path):
        run = load_run(path)
        assert run.kind == "W&B" and run.label == "gapo-offline"
        assert run.steps == {s: {k: float(v) for k, v in d.items()} for s, d in logged.items()}, path
    result = plot_runs([tmp_path / "wandb"], tmp_path / "w.png", echo=lambda _: None)
    assert_png(result["out"])
    c4 = lines_of(result, "clip fraction")[("gapo-offline", "c4")]
    assert c4 == {s: m["gapo/clipfrac_pos/c4"] for s, m in logged.items() if "gapo/clipfrac_pos/c4" in m}
    assert c4[1] == 0.125 and c4[2] == 0.7 and len(c4) == 202


@pytest.mark.usefixtures("wandb_service")
def test_wandb_resumed_run_folders_merge_and_other_runs_are_refused(tmp_path):
    first = wandb_offline_run(tmp_path, "gaporesume", "r", {1: {"critic/score/mean": 0.1},
                                                              2: {"critic/score/mean": 0.2}})
    time.sleep(1.1)  # W&B names run folders by the second
    second = wandb_offline_run(tmp_path, "gaporesume", "r", {2: {"critic/score/mean": 0.25},
                                                               3: {"critic/score/mean": 0.3}})
    assert first != second
    run = load_run(tmp_path / "wandb")
    assert run.steps == {1: {"critic/score/mean": 0.1}, 2: {"critic/score/mean": 0.25}, 3: {"critic/score/mean": 0.3}}
    assert "2 W&B folders of run gaporesume merged by step" in run.notes[0]
    wandb_offline_run(tmp_path, "gapoother", "o", {1: {"critic/score/mean": 0.0}})
    with pytest.raises(MetricsNotFound, match=r"holds 2 different W&B runs \(3 folders\); pass one of"):
        load_run(tmp_path / "wandb")
    assert load_run(second).steps == {2: {"critic/score/mean": 0.25}, 3: {"critic/score/mean": 0.3}}


# ------------------------------------------------------------------ a real smoke run
@pytest.mark.slow
def test_plot_of_a_real_smoke_run(smoke_run, tmp_path):
    """The session's smoke run (2 steps, then resumes to steps 3 and 4; its folder also holds verl's rollout dumps):
    the figure is written and every drawn per-c value and reward is the value the trainer logged."""
    printed = []
    result = plot_runs([smoke_run["out"]], tmp_path / "smoke.png", labels=["smoke"], echo=printed.append)
    assert_png(result["out"])
    (run,) = result["runs"]
    logs = Path(smoke_run["out"]) / "logs"
    assert run.files == [logs / "run1.jsonl", logs / "run2.jsonl", logs / "run3.jsonl"]
    logged = smoke_run["metrics"]
    assert sorted(run.steps) == sorted(logged) == [1, 2, 3, 4]
    drawn = {title: lines_of(result, title) for title in ("clip fraction", "mean |ratio - 1|", "reward")}
    for title, prefix in (("clip fraction", "gapo/clipfrac_pos/c"), ("mean |ratio - 1|", "gapo/ratio_dev_pos/c")):
        expected: dict = {}
        for step, metrics in logged.items():
            for key, value in metrics.items():
                if key.startswith(prefix):
                    expected.setdefault(("smoke", f"c{key[len(prefix):]}"), {})[step] = value
        assert expected and drawn[title] == expected, title
    assert drawn["reward"] == {("smoke", ""): {s: m["critic/score/mean"] for s, m in logged.items()}}
    expected = {("smoke", key): {s: m[metric] for s, m in logged.items() if metric in m}
                for key, metric in CORR_KEYS.items()}
    assert expected[("smoke", "window")] and lines_of(result, "corr(") == {k: v for k, v in expected.items() if v}
    # the smoke preset does not validate (trainer.test_freq: -1): that panel is skipped with a note
    # the exploration panels: every drawn value is the logged one
    from recipe.plot_run import EXPLORE_PANELS
    for title, _, keys in EXPLORE_PANELS:
        expected = {("smoke", key): {s: m[metric] for s, m in logged.items() if metric in m}
                    for key, metric in keys.items()}
        assert expected and lines_of(result, title) == {k: v for k, v in expected.items() if v}, title
    assert [p.title.split(" ")[0] for p in result["panels"]] == ["clip", "mean", "corr(|ratio", "entropy", "entrance",
                                                                 "live", "reward"]
    assert any(note.startswith("validation pass@k") for note in result["skipped"])
    text = "\n".join(printed)
    assert "smoke: 4 steps (1..4) from file logger logs/run1.jsonl, logs/run2.jsonl, logs/run3.jsonl" in text
    assert "3 files merged by step" in text and "panel skipped: validation pass@k" in text
    panels, _ = build_panels([run])
    assert len(panels) == 7
