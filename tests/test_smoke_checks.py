"""The smoke run's own checks reject runs that show nothing; project packages shadow verl's installed ones."""

from pathlib import Path

import pytest

from recipe.smoke import SmokeCheckError, check, loss_mode_of, shape_overrides

ROOT = Path(__file__).resolve().parents[1]


def _step(mixed=0.5, lo=0.03, hi=0.05, clip=0.2, loss_eps=True, logp_gap=3e-8, explore=True):
    m = {"gapo/groups/mixed_frac": mixed, "gapo/eps_high/min": lo, "gapo/eps_high/max": hi,
         "gapo/clipfrac_pos/c2": clip}
    if explore:  # the exploration instruments a smoke step must log (recipe.smoke.EXPLORATION_REQUIRED)
        m.update({"gapo/explore/entropy_success": 3.7, "gapo/explore/entropy_failure": 3.8,
                  "gapo/explore/entrance_distinct": 0.9, "gapo/explore/coverage_frac": 1.0,
                  "gapo/explore/coverage_window": 8.0})
    if logp_gap is not None:
        m["training/rollout_probs_diff_max"] = logp_gap
    if loss_eps:
        m["gapo/loss_eps_high_mean"] = (lo + hi) / 2
    return m


def _shards(root: Path, world_size: int, skip=()):
    """Each step's per-rank files as verl 0.9.1 writes them (minus `skip`)."""
    for step in (1, 2, 3):
        actor = root / f"global_step_{step}" / "actor"
        actor.mkdir(parents=True, exist_ok=True)
        for rank in range(world_size):
            for kind in ("model", "optim", "extra_state"):
                name = f"{kind}_world_size_{world_size}_rank_{rank}.pt"
                if (step, name) not in skip:
                    (actor / name).write_bytes(b"")


@pytest.fixture
def ckpt(tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    _shards(tmp_path, 1)
    return tmp_path


def test_a_good_run_passes(ckpt):
    check({1: _step(), 2: _step()}, {3: _step()}, 2, 1, ckpt)


def test_a_run_at_world_size_2_needs_every_ranks_shard(tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    _shards(tmp_path, 2, skip={(2, "optim_world_size_2_rank_1.pt")})
    with pytest.raises(SmokeCheckError, match=r"checkpoint of step 2 lacks \['optim_world_size_2_rank_1.pt'\]"):
        check({1: _step(), 2: _step()}, {3: _step()}, 2, 1, tmp_path, world_size=2)
    _shards(tmp_path, 2)
    check({1: _step(), 2: _step()}, {3: _step()}, 2, 1, tmp_path, world_size=2)
    with pytest.raises(SmokeCheckError, match="world size 4: one shard per rank"):  # shards of another size
        check({1: _step(), 2: _step()}, {3: _step()}, 2, 1, tmp_path, world_size=4)


def test_shape_overrides():
    assert shape_overrides() == ["trainer.nnodes=1", "trainer.n_gpus_per_node=1", "ray_kwargs.ray_init.num_gpus=1"]
    assert shape_overrides(ranks=2) == ["trainer.nnodes=1", "trainer.n_gpus_per_node=2",
                                        "ray_kwargs.ray_init.num_gpus=2"]
    # a cluster has its GPUs from `ray start`; submit.sh nulls ray_init's
    assert shape_overrides(ranks=1, nodes=2) == ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"]
    with pytest.raises(SmokeCheckError, match="at least 1"):
        shape_overrides(ranks=0)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(mixed=0.0), "no mixed group"),
        (dict(lo=0.05, hi=0.05), "more than one threshold"),
        (dict(clip=0.0), "nothing was ever clipped"),
        (dict(loss_eps=False), "did not reach the loss"),
        # a rollout engine that kept the old weights: the gap after an update is far above fp32 noise
        (dict(logp_gap=2e-3), "did not sample from the actor's weights"),
        (dict(logp_gap=None), "did not sample from the actor's weights"),
        (dict(explore=False), "exploration instruments did not run"),
    ],
)
def test_runs_that_show_nothing_are_rejected(ckpt, bad, message):
    with pytest.raises(SmokeCheckError, match=message):
        check({1: _step(**bad), 2: _step(**bad)}, {3: _step(**bad)}, 2, 1, ckpt)


def test_a_peers_run_needs_no_gapo_thresholds_but_bapo_must_log_its_bounds(ckpt):
    # a peer (docs/peers.md) logs no gapo/eps_high/*: one threshold is no failure there
    peer = {k: v for k, v in _step().items() if not k.startswith("gapo/eps_high/")}
    check({1: dict(peer), 2: dict(peer)}, {3: dict(peer)}, 2, 1, ckpt, loss_mode="dcpo")
    with pytest.raises(SmokeCheckError, match="more than one threshold"):
        check({1: dict(peer), 2: dict(peer)}, {3: dict(peer)}, 2, 1, ckpt, loss_mode="gapo")
    with pytest.raises(SmokeCheckError, match="actor/bapo_clip_low.*BAPO's bounds did not reach the metrics"):
        check({1: dict(peer), 2: dict(peer)}, {3: dict(peer)}, 2, 1, ckpt, loss_mode="bapo")
    bapo = {**peer, "actor/bapo_clip_low": 0.9, "actor/bapo_clip_high": 1.75, "actor/bapo_pos_share": 0.5}
    check({1: dict(bapo), 2: dict(bapo)}, {3: dict(bapo)}, 2, 1, ckpt, loss_mode="bapo")
    # the peer still needs everything else: its thresholds in the loss, something clipped
    with pytest.raises(SmokeCheckError, match="did not reach the loss"):
        no_loss = {k: v for k, v in bapo.items() if k != "gapo/loss_eps_high_mean"}
        check({1: dict(no_loss), 2: dict(no_loss)}, {3: dict(no_loss)}, 2, 1, ckpt, loss_mode="bapo")


def test_the_loss_mode_is_read_from_the_overrides_the_last_one_winning():
    key = "actor_rollout_ref.actor.policy_loss.loss_mode"
    assert loss_mode_of([]) == "gapo" and loss_mode_of(["trainer.nnodes=1"]) == "gapo"
    assert loss_mode_of([f"{key}=bapo", "x=1", f"{key}=dcpo"]) == "dcpo"
    assert loss_mode_of([f"++{key}=bapo"]) == "bapo"
    # through the peer group (a file of configs/peer/)
    assert loss_mode_of(["+peer=sapo"]) == "sapo_diagnosed" and loss_mode_of(["+peer=dcpo", f"{key}=gapo"]) == "gapo"


def test_a_resume_that_starts_over_is_rejected(ckpt):
    with pytest.raises(SmokeCheckError, match="must continue from the checkpoint"):
        check({1: _step(), 2: _step()}, {1: _step()}, 2, 1, ckpt)


def test_project_packages_win_over_the_ones_verl_installs():
    # verl 0.9.1 installs top-level `tests` and `recipe` folders into site-packages.
    import recipe
    import tests

    assert Path(tests.__file__).resolve().parent == ROOT / "tests"
    assert Path(recipe.__file__).resolve().parent == ROOT / "recipe"


def test_logged_steps_reads_complete_lines_only(tmp_path):
    from recipe.smoke import logged_steps

    path = tmp_path / "run1.jsonl"
    assert logged_steps(path) == []  # before the first step
    path.write_text('{"step": 1, "data": {}}\n{"step": 2, "data": {}}\n{"step": 3, "da')  # step 3 being written
    assert logged_steps(path) == [1, 2]


class _RecordedRun:
    """Stands in for gapo.supervisor.SupervisedRun: records each training command, runs nothing, exits 0."""

    commands: list = []
    marker_env, token = "GAPO_TEST_MARKER", "token"

    def __init__(self, cmd, env, log_file, cwd=None, timeout_s=None):
        from types import SimpleNamespace

        self.commands.append(cmd)
        self.proc = SimpleNamespace(pid=0)

    def wait(self):
        from gapo.supervisor import RunResult

        return RunResult(0, 0.0, 0)


class _FakeCluster:
    """Stands in for gapo.local_cluster.LocalRayCluster (nothing starts)."""

    address, dashboard_url, auth = "127.0.0.1:1", "http://127.0.0.1:1", {}

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def peak_memory(self):
        import contextlib

        return contextlib.nullcontext({})


@pytest.mark.parametrize("nodes", [1, 2])
def test_cli_overrides_reach_both_training_runs_last(tmp_path, monkeypatch, nodes):
    """`python -m recipe.smoke KEY=VALUE ... --steps 3` (make smoke SMOKE_ARGS=...): every override, in the order
    given and after the smoke's own (hydra: the last value wins), is on the command line of the first run and of the
    resume; with --nodes 2 on launch/submit.sh's. Options may follow overrides."""
    import gapo.local_cluster
    import recipe.smoke as smoke

    monkeypatch.setattr(smoke, "SupervisedRun", _RecordedRun)
    monkeypatch.setattr(smoke, "prepare", lambda out: None)
    monkeypatch.setattr(gapo.local_cluster, "LocalRayCluster", _FakeCluster)
    monkeypatch.setattr(_RecordedRun, "commands", [])
    user = ["actor_rollout_ref.actor.policy_loss.schedule=exp", "+trainer.extra_knob=1"]
    with pytest.raises(SystemExit) as exit_:  # nothing ran, so no metrics: the smoke says so after both runs
        smoke.main(["--out", str(tmp_path), user[0], "--steps", "3", user[1], "--nodes", str(nodes)])
    assert "no metrics file" in str(exit_.value)
    first, resume = _RecordedRun.commands
    assert (first[:2] == ["bash", str(ROOT / "launch" / "submit.sh")]) == (nodes > 1)
    for cmd, total in ((first, 3), (resume, 4)):
        own = [cmd.index(f"trainer.total_training_steps={total}"), cmd.index(f"trainer.nnodes={nodes}")]
        positions = [cmd.index(override) for override in user]
        assert positions == sorted(positions) and min(positions) > max(own), cmd


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.total_training_steps=3", "use --steps (first run) and --resume-steps"),
        ("++trainer.n_gpus_per_node=2", "use --ranks"),
        ("platform=cpu_vllm", "use --rollout"),
        ("trainer.default_local_dir=/tmp/x", "use --out"),
        ("actor_rollout_ref.rollout.n", "is not a hydra override"),
    ],
)
def test_overrides_of_what_the_smoke_sets_are_refused_before_any_run(tmp_path, monkeypatch, override, message):
    import recipe.smoke as smoke

    monkeypatch.setattr(smoke, "SupervisedRun", _RecordedRun)
    monkeypatch.setattr(_RecordedRun, "commands", [])
    with pytest.raises(SystemExit) as exit_:
        smoke.main(["--out", str(tmp_path), "actor_rollout_ref.rollout.n=4", override])
    assert "overrides refused" in str(exit_.value) and message in str(exit_.value)
    assert "rollout.n=4" not in str(exit_.value) and _RecordedRun.commands == []


def test_make_smoke_passes_smoke_args_through():
    """make smoke SMOKE_ARGS="..." ends recipe.smoke's command line with them (make -n)."""
    import subprocess

    def dry(*assignments):
        out = subprocess.run(["make", "-n", "smoke", "PY=python", *assignments], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        (line,) = [line for line in out.stdout.splitlines() if "-m recipe.smoke" in line]
        return line.split()

    assert dry()[-2:] == ["--nodes", "1"]
    assert dry("SMOKE_ARGS=a.b=1 --steps 3")[-3:] == ["a.b=1", "--steps", "3"]


class _RayStartRun:
    """Stands in for SupervisedRun: the first `fail_first` runs write `failure` to the log and exit 1, later ones exit
    0. Records each command (its Ray temp dir differs per attempt)."""

    commands: list = []
    fail_first, failure = 0, ""
    marker_env, token = "GAPO_TEST_MARKER", "token"

    def __init__(self, cmd, env, log_file, cwd=None, timeout_s=None):
        from types import SimpleNamespace

        self.cmd, self.log_file = cmd, log_file
        self.commands.append(cmd)
        self.proc = SimpleNamespace(pid=0)

    def wait(self):
        from gapo.supervisor import RunResult

        failing = len(self.commands) <= self.fail_first
        self.log_file.write_text(f"attempt {len(self.commands)}\n" + (self.failure if failing else "ok\n"))
        return RunResult(1 if failing else 0, 0.0, 0)


RAY_TIMEOUT_LOG = ("Exception: The current node timed out during startup. This could happen because some of the "
                   "raylet failed to startup or the GCS has become overloaded.\n")


@pytest.mark.parametrize("fail_first, runs", [(0, 1), (1, 2), (2, 3)])
def test_a_run_whose_ray_node_timed_out_at_start_is_started_again(tmp_path, monkeypatch, fail_first, runs):
    from recipe import smoke

    monkeypatch.setattr(smoke, "SupervisedRun", _RayStartRun)
    monkeypatch.setattr(_RayStartRun, "commands", [])
    monkeypatch.setattr(_RayStartRun, "fail_first", fail_first)
    monkeypatch.setattr(_RayStartRun, "failure", RAY_TIMEOUT_LOG)
    smoke.train(tmp_path, "run1", 1, [])
    assert len(_RayStartRun.commands) == runs
    # each attempt in its own Ray temp dir; each failed attempt's log kept beside the last one
    assert len({cmd[-1] for cmd in _RayStartRun.commands}) == runs
    logs = tmp_path / "logs"
    assert (logs / "run1.log").read_text() == f"attempt {runs}\nok\n"
    assert sorted(p.name for p in logs.glob("run1.log.attempt*")) == [f"run1.log.attempt{i}" for i in range(1, runs)]


def test_ray_start_retries_stop_after_the_last_attempt_and_other_failures_are_not_retried(tmp_path, monkeypatch):
    from recipe import smoke

    monkeypatch.setattr(smoke, "SupervisedRun", _RayStartRun)
    monkeypatch.setattr(_RayStartRun, "commands", [])
    monkeypatch.setattr(_RayStartRun, "fail_first", 99)
    monkeypatch.setattr(_RayStartRun, "failure", RAY_TIMEOUT_LOG)
    with pytest.raises(SmokeCheckError, match="timed out during startup"):
        smoke.train(tmp_path / "a", "run1", 1, [])
    assert len(_RayStartRun.commands) == smoke.RAY_START_ATTEMPTS == 3
    monkeypatch.setattr(_RayStartRun, "commands", [])
    monkeypatch.setattr(_RayStartRun, "failure", "GAPO config error: unknown key\n")
    with pytest.raises(SmokeCheckError, match="unknown key"):
        smoke.train(tmp_path / "b", "run1", 1, [])
    assert len(_RayStartRun.commands) == 1
    assert not list((tmp_path / "b" / "logs").glob("*.attempt*"))
