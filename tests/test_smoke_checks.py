"""The smoke run's own checks reject runs that show nothing; project packages shadow verl's installed ones."""

from pathlib import Path

import pytest

from recipe.smoke import SmokeCheckError, check, shape_overrides

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
