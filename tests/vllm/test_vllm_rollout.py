"""verl's real vLLM rollout on CPU (vLLM's CPU build), in training: the path users run on GPUs.

1. Weight sync, offline (one vLLM engine in this process, fast): loading new weights into a running engine the
   way verl's rollout worker does (``model.load_weights`` then vLLM's ``process_weights_after_loading``) makes
   vLLM sample with the new policy: its log-probs equal HF's of the new weights to fp32 precision, while a stale
   engine differs by far more than the smoke run's 1e-5 bound (so that bound catches a skipped sync). Without
   the project's plug-in (gapo/vllm_cpu.py) the reload fails as verl's does.
2. Training end to end (slow): the GAPO run of the session's reduced study with verl's vLLM rollout
   (tests/vllm/conftest.py: the smoke preset with dynamic batch sizes, 3 steps, a checkpoint at step 3), resumed
   here for step 4 with the run's own command line: per step the rollout/actor log-prob gap is below 1e-5 (the
   resumed engine got the checkpoint's weights), GAPO's thresholds reach the loss and the per-c diagnostics are
   logged; nothing of the runs is left (processes, /dev/shm segments).
3. A broken engine (slow): without the plug-in, verl's first weight sync fails inside the vLLM server and verl
   hangs; the project's runner ends the run with the named error within a bounded time and leaves nothing.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from gapo.supervisor import SHM_DIR
from recipe.smoke import MAX_ROLLOUT_PROBS_DIFF, SmokeCheckError, read_metrics, run_smoke, train

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# The broken run's hard limit. The failure itself shows ~1.5 min in (verl's and vLLM's start; 3 min on 2 cores
# shared with other runs); the runner then ends the run within its grace (30 s) of the server's error. A run ended
# by this limit instead raises a different error ("wall-clock limit"), which the test rejects.
BROKEN_RUN_LIMIT_S = 600


def shm_now() -> set[str]:
    return {p.name for p in SHM_DIR.iterdir()}


# ------------------------------------------------------------------------------------ weight sync, offline
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from gapo.smoke.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm") / "model")


def _engine(model_path):
    from vllm import LLM

    return LLM(model=str(model_path), dtype="float32", enforce_eager=True, seed=0, max_model_len=64,
               kv_cache_memory_bytes=64 * 2**20, enable_prefix_caching=False)


def _sample(llm, prompts: list[list[int]], seed: int = 0):
    """(token ids, vLLM's log-prob of each sampled token) per prompt, temperature 1."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=1.0, max_tokens=8, logprobs=0, seed=seed, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = []
    for out in outs:
        o = out.outputs[0]
        result.append((list(o.token_ids), [lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)]))
    return result


def _hf_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def _gap(samples, model, prompts) -> float:
    return max((torch.tensor(lps) - _hf_logprobs(model, p, toks)).abs().max().item()
               for p, (toks, lps) in zip(prompts, samples))


def _reload(llm, state: dict[str, torch.Tensor]) -> None:
    """What verl's vLLM worker does on a sync (verl/workers/rollout/vllm_rollout/utils.py): load, then re-run
    vLLM's post-load processing once."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    config = llm.llm_engine.model_config

    def load(model):
        model.load_weights(iter(state.items()))
        process_weights_after_loading(model, config, torch.device("cpu"))

    llm.apply_model(load)


def _perturbed(model_path):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    new = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # an update that moves every weight, linear layers included
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return base.eval(), new.eval()


PROMPTS = [[2, 10, 11, 12], [2, 20, 21], [2, 30, 31, 32, 33, 34]]


@pytest.fixture(scope="module")
def in_process():
    # the engine core in this process, so that apply_model runs on the model object here
    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    yield
    if old is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old


def test_a_weight_sync_reaches_the_cpu_engine_and_a_stale_engine_would_be_caught(tiny, in_process):
    import vllm.plugins

    vllm.plugins.load_general_plugins()
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    assert UnquantizedLinearMethod.process_weights_after_loading.__module__ == "gapo.vllm_cpu"  # our plug-in loaded
    from torch._dynamo.utils import counters

    counters.clear()
    base, new = _perturbed(tiny)
    llm = _engine(tiny)
    try:
        before = _sample(llm, PROMPTS)
        # the engine's warm-up (its dummy sampler run) and log-prob ranks compiled nothing (gapo/vllm_cpu.py)
        assert not counters["frames"], dict(counters["frames"])
        assert _gap(before, base, PROMPTS) < MAX_ROLLOUT_PROBS_DIFF  # vLLM fp32 == HF fp32
        # a stale engine (sync skipped) against the updated actor: far above the smoke run's bound
        assert _gap(before, new, PROMPTS) > 100 * MAX_ROLLOUT_PROBS_DIFF
        _reload(llm, new.state_dict())
        after = _sample(llm, PROMPTS, seed=1)
        assert _gap(after, new, PROMPTS) < MAX_ROLLOUT_PROBS_DIFF
        _reload(llm, base.state_dict())  # and back: every sync, not only the first
        again = _sample(llm, PROMPTS, seed=2)
        assert _gap(again, base, PROMPTS) < MAX_ROLLOUT_PROBS_DIFF
    finally:
        del llm


def test_the_plugin_runs_vllms_compiled_sampler_helpers_eagerly_with_the_same_results():
    """On CPU the plug-in swaps each torch.compile wrapper of vLLM's sampler helpers for the function it wraps:
    the same ops, no inductor build at engine start (gapo/vllm_cpu.py)."""
    import vllm.plugins

    vllm.plugins.load_general_plugins()
    from vllm.v1.sample import sampler
    from vllm.v1.sample.ops import logprobs, topk_topp_sampler

    for module, name in ((topk_topp_sampler, "compiled_random_sample"), (logprobs, "batched_count_greater_than"),
                         (sampler, "batched_count_greater_than")):
        fn = getattr(module, name)
        assert not hasattr(fn, "_torchdynamo_orig_callable") and fn.__name__ == name, (module.__name__, name)
    assert sampler.batched_count_greater_than is logprobs.batched_count_greater_than
    # ranks: how many log-probs of each row are >= the row's value (ties counted, as vLLM's rank is 1-based)
    x = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.1, -0.1, -4.0, -0.2]])
    assert logprobs.batched_count_greater_than(x, torch.tensor([[-2.0], [-0.1]])).tolist() == [3, 2]
    # one sample per row, the argmax of probs / exponential noise: a row whose mass is all on one token draws it
    logits = torch.full((3, 5), -1e9)
    logits[0, 4] = logits[1, 0] = logits[2, 2] = 0.0
    assert topk_topp_sampler.compiled_random_sample(logits).tolist() == [4, 0, 2]


def test_without_the_plugin_vllms_cpu_layers_drop_their_weights(tiny):
    """vLLM's own CPU processing empties each linear weight: the reload verl does then fails (the note's hang)."""
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(64, 64), requires_grad=False)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)  # what vLLM 0.24.0 does without the plug-in
    assert layer.weight.numel() == 0
    kept = torch.nn.Module()
    kept.weight = torch.nn.Parameter(torch.randn(64, 64), requires_grad=False)
    linear.UnquantizedLinearMethod.process_weights_after_loading(None, kept)  # with it
    assert kept.weight.shape == (64, 64)
    x = torch.randn(3, 64)
    assert torch.allclose(kept.cpu_linear(x, kept.weight, None), x @ kept.weight.T, atol=1e-5)


# ------------------------------------------------------------------------------------ training end to end
@pytest.fixture(scope="module")
def vllm_smoke(reduced_study):
    """The reduced study's GAPO run (3 steps, its checkpoint of step 3) resumed for step 4 with the arguments the study
    ran it with (its commands.sh), as `train` runs any smoke run: {"run1", "run2": metrics by step, "out": the run's
    folder, "study": the study's, "ckpt_dir", "runs": [the resume's process identifiers], "shm_before"}."""
    import shlex

    from recipe.studies.gspo_vs_gapo import run_name

    study = reduced_study["out"]
    out = study / "runs" / run_name("gapo_linear", 0)
    lines = [line for line in (study / "commands.sh").read_text().splitlines() if not line.startswith("#")]
    [args] = [args for args in map(shlex.split, lines) if f"trainer.experiment_name=study_{out.name}" in args]
    steps = args.index(next(a for a in args if a.startswith("trainer.total_training_steps=")))
    overrides = args[steps + 1:]
    before = shm_now()
    resumed = train(out, "resume", int(args[steps].split("=")[1]) + 1, overrides)
    return {"run1": read_metrics(out / "logs" / "train.jsonl"), "run2": read_metrics(resumed["metrics_file"]),
            "out": out, "study": study, "ckpt_dir": out / "checkpoints", "runs": [resumed], "shm_before": before}


def trained(metrics: dict[int, dict]) -> dict[int, dict]:
    """The training steps of a run's metrics (step 0 and a resume's first entry can hold validation alone)."""
    return {step: m for step, m in metrics.items() if "training/rollout_probs_diff_max" in m}


@pytest.mark.slow
def test_training_with_vllm_rollouts_syncs_weights_every_step(vllm_smoke):
    run1, run2 = trained(vllm_smoke["run1"]), trained(vllm_smoke["run2"])
    assert sorted(run1) == [1, 2, 3] and sorted(run2) == [4]  # the resumed run continued from the checkpoint
    ckpt = vllm_smoke["ckpt_dir"]
    resume_log = (vllm_smoke["out"] / "logs" / "resume.log").read_text(errors="replace")
    assert f"Resuming from {ckpt}/global_step_3, setting global step to 3" in resume_log
    every = {**run1, **run2}
    for step, m in every.items():
        assert m["training/rollout_probs_diff_max"] < MAX_ROLLOUT_PROBS_DIFF, step
        assert m["timing_s/update_weights"] >= 0, step
    for log in ("train.log", "resume.log"):
        text = (vllm_smoke["out"] / "logs" / log).read_text(errors="replace")
        assert "vLLMHttpServer" in text, log  # verl's vLLM server generated the rollouts, not the hf stand-in


@pytest.mark.slow
def test_gapo_thresholds_and_per_c_diagnostics_with_vllm_rollouts(vllm_smoke):
    every = {**trained(vllm_smoke["run1"]), **trained(vllm_smoke["run2"])}
    for step, m in every.items():
        # thresholds in the loss: between eps_low (0.02) and eps_high_max (0.05) of the smoke preset, varying
        assert 0.02 <= m["gapo/loss_eps_high_mean"] <= 0.05, step
        assert m["gapo/eps_high/max"] > m["gapo/eps_high/min"], step
        per_c = [k for k in m if k.startswith(("gapo/clipfrac_pos/c", "gapo/ratio_dev_pos/c"))]
        assert {k.split("/")[1] for k in per_c} == {"clipfrac_pos", "ratio_dev_pos"}, step
    assert any(v > 0 for m in every.values() for k, v in m.items() if k.startswith("gapo/clipfrac_pos/c"))


@pytest.mark.slow
def test_nothing_of_the_vllm_runs_is_left(vllm_smoke):
    import psutil

    # the runs' processes: their sessions, their marker variable, or their paths on the command line (Ray's raylet
    # and GCS name the run's temp dir). Not every GAPOTaskRunner: `make test` runs other trainings beside this one.
    runs = vllm_smoke["runs"]
    sessions = {r["session"] for r in runs}
    markers = {r["marker"] for r in runs}
    paths = [str(vllm_smoke["study"]), *(r["ray_tmp"] for r in runs)]  # the study's runs' and the resume's
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            env = proc.environ()
            if (os.getsid(proc.pid) in sessions or any(env.get(k) == v for k, v in markers)
                    or any(p in cmd for p in paths)):
                left.append(cmd[:120])
        except (psutil.Error, OSError):
            continue
    assert left == []
    assert shm_now() - vllm_smoke["shm_before"] == set()


# ------------------------------------------------------------------------------------ a broken engine
@pytest.mark.slow
def test_a_broken_engine_ends_the_run_with_its_error_in_bounded_time(tmp_path, monkeypatch):
    """Without the weight plug-in (VLLM_PLUGINS names only the eager sampler one) verl's first weight sync fails in
    the vLLM server; verl itself would wait forever. The runner names the error and cleans up."""
    monkeypatch.setenv("VLLM_PLUGINS", "gapo_cpu_eager_sampler")
    before = shm_now()
    start = time.time()
    with pytest.raises(SmokeCheckError, match="vLLM weight sync failed") as failure:  # not the wall-clock limit
        run_smoke(tmp_path / "broken", steps=1, resume_steps=0, rollout="vllm", timeout_s=BROKEN_RUN_LIMIT_S)
    assert time.time() - start < BROKEN_RUN_LIMIT_S
    assert "did not exit within 30 s of it" in str(failure.value)
    assert "Attempted to load weight" in str(failure.value)  # the server's own error, quoted
    assert shm_now() - before == set()
