"""Fast checks (no Ray) of gapo.cpu: the verl "cpu" platform and the "hf" rollout server.

The end-to-end proof (verl.trainer.main_ppo on CPU) is the slow smoke run; these tests pin down the
pieces it relies on: the plugin registers in a fresh process exactly as in a Ray worker, the process group
comes up as plain gloo, and the rollout server's log-probs are those of the model at the sampling
temperature, before and after a weight update.
"""

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gapo.cpu.hf_rollout import HFRolloutServer
from gapo.cpu.platform import PlatformCPU
from gapo.smoke.tiny_model import build_tiny_model
from verl.plugin.platform.platform_manager import PlatformRegistry
from verl.workers.config import HFModelConfig, RolloutConfig

RESPONSE_LENGTH = 12


def test_cpu_platform_in_fresh_process_as_in_a_ray_worker():
    """Env vars alone (what Ray workers inherit) select the platform, register "hf" and give a gloo group."""
    code = textwrap.dedent(
        """
        import os, socket
        import torch, torch.distributed as dist, verl
        from verl.plugin.platform import get_platform
        from verl.utils.device import get_device_id, get_nccl_backend
        from verl.utils.distributed import initialize_global_process_group_ray
        from verl.workers.rollout.base import get_rollout_class
        from verl.workers.rollout.replica import get_rollout_replica_class

        platform = get_platform()
        assert type(platform).__name__ == "PlatformCPU", platform
        assert platform.device_name == "cpu" and get_nccl_backend() == "gloo"
        assert get_device_id() == "cpu"
        assert get_rollout_class("hf").__name__ == "HFServerAdapter"
        assert get_rollout_replica_class("hf").__name__ == "HFReplica"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
        initialize_global_process_group_ray()  # as verl's FSDP worker calls it: no backend given
        assert dist.get_backend() == "gloo", dist.get_backend()
        t = torch.ones(2)
        dist.all_reduce(t)
        print("OK")
        """
    )
    env = dict(os.environ, VERL_PLATFORM="cpu", VERL_USE_EXTERNAL_MODULES="gapo.cpu")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr


def test_cpu_platform_registered_but_never_auto_detected(monkeypatch):
    from verl.plugin.platform.platform_manager import _detect_platform_name

    assert PlatformRegistry.get("cpu") is PlatformCPU
    assert not PlatformCPU().is_platform_available(use_smi_check=True)  # a GPU run can never land on it
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert _detect_platform_name() == "cpu"
    module = PlatformCPU().device_module
    assert module.memory_allocated() == 0 and module.is_available()
    free, total = module.mem_get_info()
    assert 0 < free <= total
    state = module.get_rng_state()
    a = torch.rand(3)
    module.set_rng_state(state)
    assert torch.equal(a, torch.rand(3))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    config = RolloutConfig(name="hf", prompt_length=32, response_length=RESPONSE_LENGTH)
    return HFRolloutServer(config, HFModelConfig(path=str(path)))


def _generate(server, prompt_ids, **sampling_params):
    params = {"top_p": 1.0, "top_k": -1, "logprobs": True, **sampling_params}
    return asyncio.run(server.generate(prompt_ids=prompt_ids, sampling_params=params, request_id="r"))


@torch.no_grad()
def _reference_log_probs(model, prompt_ids, response_ids, temperature):
    """log_softmax(logits / T) of the sampled tokens, from one forward pass over prompt + response."""
    ids = torch.tensor([prompt_ids + response_ids])
    logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(response_ids)[:, None])[:, 0]


PROMPT = [2, 10, 11, 12, 3, 2, 13]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_generate_returns_log_probs_of_the_sampling_distribution(server, temperature):
    torch.manual_seed(0)
    out = _generate(server, PROMPT, temperature=temperature, max_tokens=RESPONSE_LENGTH)
    assert 1 <= len(out.token_ids) <= RESPONSE_LENGTH
    assert len(out.log_probs) == len(out.token_ids)
    ref = _reference_log_probs(server.model, PROMPT, out.token_ids, temperature)
    torch.testing.assert_close(torch.tensor(out.log_probs), ref, atol=1e-5, rtol=2e-5)
    # The temperature really enters: the same tokens scored at another temperature differ.
    other = _reference_log_probs(server.model, PROMPT, out.token_ids, temperature * 2)
    assert not torch.allclose(torch.tensor(out.log_probs), other, atol=1e-3)


def test_generate_honours_max_tokens_top_p_and_top_k(server):
    torch.manual_seed(0)
    assert len(_generate(server, PROMPT, temperature=1.0, max_tokens=3).token_ids) <= 3
    # top_p -> 0 keeps only the most likely token: sampling must then follow the greedy path.
    sampled = _generate(server, PROMPT, temperature=1.0, top_p=1e-6, max_tokens=RESPONSE_LENGTH).token_ids
    greedy = _generate(server, PROMPT, temperature=0.0, max_tokens=RESPONSE_LENGTH).token_ids
    assert sampled == greedy
    assert _generate(server, PROMPT, temperature=1.0, top_k=1, max_tokens=RESPONSE_LENGTH).token_ids == greedy


def test_update_weights_changes_the_model_and_its_output(server):
    before = _generate(server, PROMPT, temperature=0.0, max_tokens=RESPONSE_LENGTH)
    generator = torch.Generator().manual_seed(1)
    new_weights = {
        name: p.detach() + 0.5 * torch.randn(p.shape, generator=generator)
        for name, p in server.model.state_dict().items()
    }
    asyncio.run(server.update_weights(new_weights, global_steps=7))
    for name, p in server.model.state_dict().items():
        assert torch.equal(p, new_weights[name]), name
    after = _generate(server, PROMPT, temperature=0.0, max_tokens=RESPONSE_LENGTH)
    assert after.extra_fields["global_steps"] == 7
    assert (after.token_ids, after.log_probs) != (before.token_ids, before.log_probs)
    ref = _reference_log_probs(server.model, PROMPT, after.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(after.log_probs), ref, atol=1e-5, rtol=2e-5)


def test_update_weights_rejects_unknown_names(server):
    with pytest.raises(AssertionError, match="unexpected"):
        asyncio.run(server.update_weights({"not.a.weight": torch.zeros(1)}))


def test_batched_requests_return_each_rows_own_tokens_and_log_probs(tmp_path):
    """engine_kwargs.hf.max_batch_size > 1: concurrent requests of different prompt lengths are generated as one
    left-padded batch; each answer's log-probs are those of its own unpadded sequence, and a row ends at its stop."""
    path = build_tiny_model(tmp_path / "model")
    config = RolloutConfig(name="hf", prompt_length=32, response_length=RESPONSE_LENGTH,
                           engine_kwargs={"hf": {"max_batch_size": 8}})
    batched = HFRolloutServer(config, HFModelConfig(path=str(path)))
    assert batched.max_batch_size == 8
    prompts = [PROMPT, PROMPT[:3], [2, 14, 15, 16, 17, 18, 19, 20, 3, 2], PROMPT[:5]]
    params = {"top_p": 1.0, "top_k": -1, "logprobs": True, "temperature": 1.0, "max_tokens": RESPONSE_LENGTH}
    calls = []
    real = batched._generate_batch

    def spy(prompt_list, sampling):
        calls.append(len(prompt_list))
        return real(prompt_list, sampling)

    batched._generate_batch = spy

    async def all_at_once():
        return await asyncio.gather(*(batched.generate(prompt_ids=p, sampling_params=dict(params), request_id=str(i))
                                      for i, p in enumerate(prompts)))

    torch.manual_seed(0)
    outs = asyncio.run(all_at_once())
    assert calls == [len(prompts)]  # one generate call for the four requests
    stop = set(batched.eos_token_ids)
    for prompt, out in zip(prompts, outs):
        assert 1 <= len(out.token_ids) <= RESPONSE_LENGTH and len(out.log_probs) == len(out.token_ids)
        assert not stop & set(out.token_ids[:-1])  # nothing after a stop token
        ref = _reference_log_probs(batched.model, prompt, out.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(out.log_probs), ref, atol=1e-5, rtol=2e-5)
    with pytest.raises(ValueError, match="max_batch_size must be >= 1"):
        HFRolloutServer(RolloutConfig(name="hf", prompt_length=32, response_length=RESPONSE_LENGTH,
                                      engine_kwargs={"hf": {"max_batch_size": 0}}), HFModelConfig(path=str(path)))
