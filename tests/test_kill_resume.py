"""Resume after a hard kill: SIGKILL in the middle of a checkpoint write and in the middle of a training step.

End to end on CPU (`@pytest.mark.slow`, three runs of the smoke preset, 3 steps, a checkpoint every step):
1. run1 trains from scratch and is killed inside the save of step 2: the actor is written, data.pt and the
   tracker are not (deterministic: the trainer's test hook `GAPO_TEST_CHECKPOINT_PAUSE` holds the save there);
2. run2 must resume from step 1 (not the half-written step 2), trains and commits step 2 over the half-written
   folder, and is killed in the middle of step 3 (after step 2 is logged; the hook would hold a late kill
   before step 3's commit, and the test fails if the kill did not land inside step 3);
3. run3 must resume from step 2, which also shows that the re-saved folder is complete and loadable, and trains
   step 3.
Across the three runs each step is logged exactly once. Each killed run's whole process tree, Ray's raylet,
GCS and workers included, is gone before the next run starts: every run has its own session (setsid), Ray
temp dir and marker variable, and only processes carrying them are killed (other Ray clusters on the machine
are left alone).

Without Ray (fast): `GAPOTrainer._save_checkpoint` against verl's own `_save_checkpoint` on a stand-in
trainer: same files, same calls; a crash at each point of a save leaves the previous checkpoint resumable;
retention never deletes before the commit; the test hook.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager, find_latest_ckpt_path

import gapo.verl_plugin.checkpoint as checkpoint_module
from gapo.supervisor import MARKER_ENV, SupervisedRun, SupervisedRunError
from gapo.verl_plugin.trainer import GAPOTrainer
from recipe.smoke import ROOT, prepare, run_command

TRACKER = "latest_checkpointed_iteration.txt"


def actor_files(world_size: int) -> set[str]:
    """What verl 0.9.1's FSDP checkpoint manager writes into global_step_N/actor at `world_size`: one model,
    optimizer and extra-state shard per rank, plus the FSDP and HF configs."""
    shards = {f"{kind}_world_size_{world_size}_rank_{rank}.pt" for kind in ("model", "optim", "extra_state")
              for rank in range(world_size)}
    return shards | {"fsdp_config.json", "huggingface/config.json"}


WORLD_SIZE = 1  # these runs: the smoke preset's one rank (world size 2: tests/test_cluster_e2e.py)
MODEL = f"model_world_size_{WORLD_SIZE}_rank_0.pt"
ACTOR_FILES = actor_files(WORLD_SIZE)


# ------------------------------------------------------------------------------ the save, without Ray
class FakeActorCheckpoints(BaseCheckpointManager):
    """The actor worker group's save as verl's FSDP checkpoint manager does it (files, then verl's own retention:
    `ensure_checkpoint_capacity` before, `register_checkpoint` after), without FSDP. `crash_after` names a file
    after which the save dies, as a kill would stop it."""

    def __init__(self, crash_after=None):  # no model, optimizer or processing class: only the bookkeeping
        self.previous_saved_paths = []
        self.calls = []
        self.crash_after = crash_after

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self.calls.append((os.path.relpath(local_path, self.root), hdfs_path, global_step, max_ckpt_to_keep))
        self.ensure_checkpoint_capacity(max_ckpt_to_keep)
        for name in sorted(ACTOR_FILES):
            path = Path(local_path, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{name} of step {global_step}")
            if name == self.crash_after:
                raise KeyboardInterrupt(f"killed after writing {name}")
        self.register_checkpoint(local_path, max_ckpt_to_keep)


class Recorder:
    def __init__(self):
        self.calls = []

    def on_save(self, **kwargs):
        self.calls.append({k: (os.path.basename(v) if k == "checkpoint_dir" else v) for k, v in kwargs.items()
                           if k != "trainer"})


class Loader:
    def __init__(self, killed=False):
        self.step, self.killed = 0, killed

    def state_dict(self):
        if self.killed:
            raise KeyboardInterrupt("killed before data.pt")
        return {"batches_yielded": self.step}


def stand_in(root: Path, keep=None, async_save=False, crash_after=None) -> GAPOTrainer:
    """A GAPOTrainer with just what `_save_checkpoint` reads (no Ray, no workers)."""
    trainer = object.__new__(GAPOTrainer)
    trainer.config = OmegaConf.create({
        "trainer": {"default_local_dir": str(root), "default_hdfs_dir": None, "max_actor_ckpt_to_keep": keep,
                    "max_critic_ckpt_to_keep": None},
        "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": async_save}}},
    })
    trainer.trainer_mode = "sync"
    trainer.use_critic = False
    trainer.actor_rollout_wg = FakeActorCheckpoints(crash_after)
    trainer.actor_rollout_wg.root = str(root)
    trainer.train_dataloader = Loader()
    trainer.checkpoint_callback = Recorder()
    return trainer


def save(trainer, step: int, impl=GAPOTrainer._save_checkpoint):
    trainer.global_steps = step
    trainer.train_dataloader.step = step
    impl(trainer)


def tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): (repr(torch.load(p)) if p.suffix == ".pt" and p.name == "data.pt"
                                             else p.read_text())
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_files_and_calls_as_verls_own_save(tmp_path):
    """What verl's `PPOTrainer._save_checkpoint` writes and calls, the override writes and calls (retention aside).
    If a verl upgrade changes its save (a new file, a new call, a new attribute read), this fails: re-read both."""
    ours, verls = stand_in(tmp_path / "ours"), stand_in(tmp_path / "verl")
    for step in (1, 2, 3):
        save(ours, step)
        save(verls, step, impl=PPOTrainer._save_checkpoint)
    assert tree(tmp_path / "ours") == tree(tmp_path / "verl")
    assert tree(tmp_path / "ours")[TRACKER] == "3"
    assert ours.actor_rollout_wg.calls == verls.actor_rollout_wg.calls  # keep=None: verl passes None as well
    assert ours.checkpoint_callback.calls == verls.checkpoint_callback.calls == [
        {"global_step": s, "checkpoint_dir": f"global_step_{s}", "async_save": False} for s in (1, 2, 3)]


def killed(*args, **kwargs):
    """Stands for a SIGKILL at this point: the save stops here, what is on disk stays."""
    raise KeyboardInterrupt("killed")


def test_verl_dies_on_an_empty_tracker_which_the_atomic_commit_never_leaves(tmp_path, monkeypatch):
    """verl writes the tracker with open("w") + write: a kill in between leaves it empty, and resume raises."""
    (tmp_path / "global_step_1").mkdir()
    (tmp_path / TRACKER).write_text("")
    with pytest.raises(ValueError):
        find_latest_ckpt_path(str(tmp_path))
    # the override writes a temp file and renames it over the tracker: killed before the rename, nothing changed
    (tmp_path / TRACKER).write_text("1")
    monkeypatch.setattr(checkpoint_module.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        GAPOTrainer._commit_checkpoint(str(tmp_path), 2)
    assert (tmp_path / TRACKER).read_text() == "1"
    assert find_latest_ckpt_path(str(tmp_path)) == str(tmp_path / "global_step_1")


@pytest.mark.parametrize("kill_point", ["model", "huggingface/config.json", "pause", "data.pt", "tracker temp file",
                                        "rename"])
@pytest.mark.parametrize("keep", [None, 1, 2])
def test_a_save_killed_anywhere_leaves_the_previous_checkpoint_complete_and_named(tmp_path, monkeypatch, kill_point,
                                                                                  keep):
    trainer = stand_in(tmp_path, keep=keep)
    save(trainer, 1)
    before = {k: v for k, v in tree(tmp_path).items() if k.startswith("global_step_1/")}
    if kill_point in ("model", "huggingface/config.json"):
        trainer.actor_rollout_wg.crash_after = MODEL if kill_point == "model" else kill_point
    elif kill_point == "pause":  # where the end-to-end test kills
        monkeypatch.setattr(GAPOTrainer, "_checkpoint_test_pause", killed)
    elif kill_point == "data.pt":
        monkeypatch.setattr(checkpoint_module.torch, "save", killed)
    elif kill_point == "tracker temp file":  # written, not yet synced or renamed
        monkeypatch.setattr(checkpoint_module.os, "fsync", killed)
    else:
        monkeypatch.setattr(checkpoint_module.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        save(trainer, 2)
    assert (tmp_path / TRACKER).read_text() == "1"
    assert find_latest_ckpt_path(str(tmp_path)) == str(tmp_path / "global_step_1")
    assert {k: v for k, v in tree(tmp_path).items() if k.startswith("global_step_1/")} == before  # nothing deleted
    assert trainer.actor_rollout_wg.calls[-1][3] is None  # the workers' own retention is off
    monkeypatch.undo()
    # the next run resumes from step 1, trains step 2 again and saves it over the half-written folder
    trainer = stand_in(tmp_path, keep=keep)
    save(trainer, 2)
    files = tree(tmp_path)
    assert files[TRACKER] == "2"
    assert {k[len("global_step_2/actor/"):] for k in files if k.startswith("global_step_2/actor/")} == ACTOR_FILES
    assert all(v.endswith(" of step 2") for k, v in files.items() if k.startswith("global_step_2/actor/"))
    assert "global_step_2/data.pt" in files
    assert ("global_step_1/data.pt" in files) == (keep != 1)


def test_verls_own_retention_deletes_the_named_checkpoint_before_the_commit(tmp_path):
    """Why retention moved after the commit: verl 0.9.1 with max_actor_ckpt_to_keep=1, killed after the actor save
    (before data.pt and the tracker), leaves a tracker that names a checkpoint whose weights are gone."""
    trainer = stand_in(tmp_path, keep=1)
    save(trainer, 1, impl=PPOTrainer._save_checkpoint)
    trainer.train_dataloader = Loader(killed=True)  # killed after the actor save, at data.pt
    with pytest.raises(KeyboardInterrupt):
        save(trainer, 2, impl=PPOTrainer._save_checkpoint)
    assert (tmp_path / TRACKER).read_text() == "1"
    assert not (tmp_path / "global_step_1" / "actor").exists()  # if verl fixes this, the note in the override can go


def test_retention_after_the_commit_removes_whole_older_folders_of_any_run(tmp_path):
    (tmp_path / "global_step_9" / "actor").mkdir(parents=True)  # above the committed step (an abandoned run): kept
    (tmp_path / "global_step_x").mkdir()  # not a step folder: kept
    earlier = stand_in(tmp_path, keep=2)  # a run before a restart
    save(earlier, 1)
    trainer = stand_in(tmp_path, keep=2)  # verl's retention would not know global_step_1 any more
    for step in (2, 3, 4):
        save(trainer, step)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "global_step_3", "global_step_4", "global_step_9", "global_step_x"]
    assert (tmp_path / TRACKER).read_text() == "4"
    keep_all = stand_in(tmp_path / "all")
    for step in (1, 2, 3):
        save(keep_all, step)
    assert sorted(p.name for p in (tmp_path / "all").iterdir() if p.is_dir()) == [f"global_step_{s}" for s in (1, 2, 3)]


def test_async_save_keeps_verls_code(tmp_path):
    trainer = stand_in(tmp_path, async_save=True)
    save(trainer, 1)
    assert not (tmp_path / TRACKER).exists()  # verl's async path: its callback commits
    assert trainer.checkpoint_callback.calls == [{"global_step": 1, "checkpoint_dir": "global_step_1",
                                                  "async_save": True}]


def test_pause_hook_holds_only_the_named_step_between_actor_and_commit(tmp_path, monkeypatch):
    marker = tmp_path / "paused"
    seen = []

    def sleep(seconds):  # what a test that kills the run here would find
        folder = tmp_path / "global_step_2"
        seen.append((seconds, marker.read_text().split()[1], (tmp_path / TRACKER).read_text(),
                     (folder / "actor" / MODEL).exists(), (folder / "data.pt").exists()))

    monkeypatch.setattr(checkpoint_module.time, "sleep", sleep)
    monkeypatch.setenv(GAPOTrainer.CHECKPOINT_PAUSE_ENV, f"2:{marker}")
    trainer = stand_in(tmp_path)
    save(trainer, 1)
    assert not marker.exists() and not seen
    save(trainer, 2)
    assert seen == [(GAPOTrainer.CHECKPOINT_PAUSE_S, "2", "1", True, False)]
    assert (tmp_path / TRACKER).read_text() == "2"  # not killed: the save goes on after the pause


# ------------------------------------------------------------------------------ SIGKILL, end to end
TOTAL_STEPS = 3
STEP_TIMEOUT_S = 600


class Run:
    """One training run of the smoke preset in its own session, Ray temp dir and marker, started in the background
    under the project's runner (gapo.supervisor.SupervisedRun: its process finding and killing)."""

    def __init__(self, out: Path, name: str, extra_env: dict | None = None):
        cmd, env, self.metrics_file, self.log_file = run_command(out, name, TOTAL_STEPS, [])
        self.name = name
        self.ray_tmp = tempfile.mkdtemp(prefix="gkr-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
        # its own Ray temp dir: ray.init neither joins another cluster on the machine nor shares files with one
        cmd = [*cmd, f"+ray_kwargs.ray_init._temp_dir={self.ray_tmp}"]
        env = {k: v for k, v in env.items() if not k.startswith(("RAY_ADDRESS", MARKER_ENV, "GAPO_TEST_"))}
        env.update(extra_env or {})
        self.started = time.time()
        self.run = SupervisedRun(cmd, env, self.log_file, cwd=ROOT, timeout_s=STEP_TIMEOUT_S * TOTAL_STEPS,
                                 sample_memory_s=None)
        self.proc = self.run.proc
        self.events = [(0.0, "started")]

    def note(self, what: str) -> None:
        self.events.append((round(time.time() - self.started, 1), what))

    def steps(self) -> list[int]:
        if not self.metrics_file.exists():
            return []
        return [json.loads(line)["step"] for line in self.metrics_file.read_text().splitlines() if line.endswith("}")]

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def wait_for(self, condition, what: str, timeout: float = STEP_TIMEOUT_S) -> None:
        deadline = time.time() + timeout
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited ({self.proc.returncode}) before {what}:\n{self.log()[-4000:]}")
            if time.time() > deadline:
                pytest.fail(f"{self.name}: no {what} within {timeout} s:\n{self.log()[-4000:]}")
            time.sleep(0.2)
        self.note(what)

    def processes(self) -> list[psutil.Process]:
        """The run's live processes: its session (driver, GCS, raylet, Ray workers) and anything with its marker."""
        return self.run.processes()

    def kill(self) -> None:
        """SIGKILL the whole run, then every straggler of it (Ray workers have process groups of their own, in the
        run's session), and wait until none is left."""
        self.note("SIGKILL")
        self.sweep()

    def sweep(self) -> None:
        try:
            self.run.kill()
        except SupervisedRunError as err:
            pytest.fail(f"{self.name}: {err}")
        self.note("all processes gone")
        shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def finish(self, timeout: float = STEP_TIMEOUT_S) -> None:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not finish within {timeout} s:\n{self.log()[-4000:]}")
        self.note(f"exit {rc}")
        assert rc == 0, f"{self.name} failed:\n{self.log()[-4000:]}"
        self.sweep()  # Ray's processes end with the driver; makes sure of it

    def summary(self) -> dict:
        return {"steps_logged": self.steps(), "events": self.events}


def checkpoint_state(ckpt: Path) -> dict:
    tracker = ckpt / TRACKER
    return {"tracker": tracker.read_text() if tracker.exists() else None,
            "folders": {p.name: sorted(q.relative_to(p).as_posix() for q in p.rglob("*") if q.is_file())
                        for p in sorted(ckpt.glob("global_step_*"))}}


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("kill_resume")
    prepare(out)
    ckpt = out / "checkpoints"
    runs, state = {}, {}
    started = time.time()
    try:
        # run1: killed inside the save of step 2, after the actor, before data.pt and the tracker
        marker = out / "paused_at_step_2"
        run1 = runs["run1"] = Run(out, "run1", {GAPOTrainer.CHECKPOINT_PAUSE_ENV: f"2:{marker}"})
        run1.wait_for(lambda: 1 in run1.steps(), "step 1 logged")
        run1.wait_for(marker.exists, "save of step 2 paused before its commit")
        run1.kill()
        state["after_run1"] = checkpoint_state(ckpt)

        # run2: resumes, commits step 2, killed in the middle of step 3
        marker3 = out / "paused_at_step_3"  # a kill that came late would find step 3 held here, not committed
        run2 = runs["run2"] = Run(out, "run2", {GAPOTrainer.CHECKPOINT_PAUSE_ENV: f"3:{marker3}"})
        run2.wait_for(lambda: 2 in run2.steps(), "step 2 logged")
        time.sleep(1.0)  # step 3 is under way (a step takes 2 s or more on these machines)
        run2.kill()
        state["run2_step3_save_reached"] = marker3.exists()
        state["after_run2"] = checkpoint_state(ckpt)

        # run3: resumes and finishes
        run3 = runs["run3"] = Run(out, "run3")
        run3.finish()
        state["after_run3"] = checkpoint_state(ckpt)
    finally:
        for run in runs.values():
            if run.proc.poll() is None or run.processes():
                run.kill()
    state["wall_s"] = round(time.time() - started, 1)
    timeline = {name: run.summary() for name, run in runs.items()} | state
    (out / "timeline.json").write_text(json.dumps(timeline, indent=1))
    print("\n[kill-resume] timeline:\n" + json.dumps(timeline, indent=1))
    return {"runs": runs, "state": state, "ckpt": ckpt, "out": out}


@pytest.mark.slow
def test_kill_inside_a_checkpoint_write_resumes_from_the_last_complete_checkpoint(killed_runs):
    runs, state, ckpt = killed_runs["runs"], killed_runs["state"], killed_runs["ckpt"]
    assert "Training from scratch" in runs["run1"].log()
    assert runs["run1"].steps() == [1]
    after = state["after_run1"]
    assert after["tracker"] == "1"  # the half-written step 2 was never committed
    half = after["folders"]["global_step_2"]
    assert f"actor/{MODEL}" in half and "data.pt" not in half  # killed between the actor and the commit
    log2 = runs["run2"].log()
    assert f"Resuming from {ckpt}/global_step_1, setting global step to 1" in log2
    assert "global_step_2, setting global step" not in log2


@pytest.mark.slow
def test_kill_in_the_middle_of_a_step_resumes_from_the_step_before(killed_runs):
    runs, state, ckpt = killed_runs["runs"], killed_runs["state"], killed_runs["ckpt"]
    assert runs["run2"].steps() == [2]
    # killed inside step 3: step 2 committed, step 3 neither saved (its save was not even reached) nor logged
    assert not state["run2_step3_save_reached"], "the kill came after step 3's training: not a mid-step kill"
    assert state["after_run2"]["tracker"] == "2" and "global_step_3" not in state["after_run2"]["folders"]
    log3 = runs["run3"].log()
    assert f"Resuming from {ckpt}/global_step_2, setting global step to 2" in log3
    assert "Loaded model from" in log3 and "Loaded optimizer from" in log3  # the re-saved folder loads
    assert runs["run3"].steps() == [3]


@pytest.mark.slow
def test_every_step_logged_exactly_once_and_the_last_checkpoint_complete(killed_runs):
    runs, state = killed_runs["runs"], killed_runs["state"]
    logged = [step for name in ("run1", "run2", "run3") for step in runs[name].steps()]
    assert logged == list(range(1, TOTAL_STEPS + 1))  # none twice, none skipped
    final = state["after_run3"]
    assert final["tracker"] == str(TOTAL_STEPS)
    expected = sorted({f"actor/{f}" for f in ACTOR_FILES} | {"data.pt"})
    for step in range(1, TOTAL_STEPS + 1):
        assert set(expected) <= set(final["folders"][f"global_step_{step}"]), step


@pytest.mark.slow
def test_the_half_written_folder_was_overwritten_by_the_resumed_run(killed_runs):
    """Every file of step 2's checkpoint was written by run2 (none is left from run1's interrupted save), and each
    one loads."""
    runs, ckpt = killed_runs["runs"], killed_runs["ckpt"]
    folder = ckpt / "global_step_2"
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files and all(p.stat().st_mtime >= runs["run2"].started for p in files)
    for path in files:
        if path.suffix == ".pt":
            assert torch.load(path, weights_only=False) is not None, path
    assert torch.load(folder / "data.pt", weights_only=False) != torch.load(ckpt / "global_step_1" / "data.pt",
                                                                            weights_only=False)


@pytest.mark.slow
def test_nothing_of_the_killed_runs_is_left(killed_runs):
    for name, run in killed_runs["runs"].items():
        assert run.processes() == [], name
        assert not Path(run.ray_tmp).exists(), name
