"""HF-transformers rollout engine for verl, registered as rollout name "hf". CPU development and tests only.

verl 0.9.1 ships rollout engines for vLLM, SGLang and TensorRT-LLM only, none of which runs on a CPU machine.
verl's rollout is always "server mode"; this module provides the three pieces it expects:

- ``HFRolloutServer``: a Ray actor holding a plain HF causal LM. ``generate`` samples one sequence with
  ``transformers``' ``generate`` and returns the sampled token ids with their log-probs, computed like
  vLLM's ``processed_logprobs``: ``log_softmax(logits / temperature)`` over the full vocabulary.
- ``HFReplica``: the ``RolloutReplica`` that launches one server per replica (hybrid mode: the trainer's
  workers own the logical GPUs; the server is an extra actor beside them).
- ``HFServerAdapter``: the worker-side ``BaseRollout``; it gathers the actor's weights after each step and
  pushes them to its replica's server (verl's "naive" checkpoint-engine path).

Requests are batched up to ``rollout.engine_kwargs.hf.max_batch_size`` (default 1: one at a time, which a 2-core CPU
gains nothing from changing on a tiny model, and which makes a run's samples repeat given the order of its requests).
A real model gains from batching: SmolLM2-135M's 32 requests of 16 tokens took 41 s one at a time (``make learn``,
docs/learn.md). Requests that arrive together with the same sampling parameters are generated as one left-padded
batch; log-probs are those of each row's own tokens, as for one request. The lock keeps weight updates from landing
in the middle of a generation.
"""

import asyncio
from typing import Any, Optional

import ray
import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator


def _server_name(replica_rank: int, name_suffix: str = "") -> str:
    """Ray actor name of a replica's server; the worker-side adapter finds its server by it."""
    return f"hf_server_{replica_rank}{name_suffix}"


class HFRolloutServer:
    """Token-in/token-out generation server around an HF causal LM (runs as an async Ray actor).

    Besides ``generate`` and ``update_weights`` it answers the control calls verl makes on every rollout server:
    ``wake_up``, ``sleep``, ``clear_kv_cache``, ``release_kv_cache``, ``resume_kv_cache``, ``resume_generation``,
    ``start_profile`` and ``stop_profile`` do nothing (the weights stay in host memory, no KV cache outlives a
    request), and ``abort_all_requests`` aborts none (requests run one at a time and always finish).
    """

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, replica_rank: int = 0):
        """Load the model in float32 with eager attention and seed sampling with ``rollout.seed + replica_rank``.

        Args:
            config: verl's rollout config (``prompt_length``, ``response_length`` bound a response; ``seed``).
            model_config: verl's model config (path, tokenizer, generation config: only its EOS ids are kept).
            replica_rank: this server's replica, added to the seed so that replicas sample differently.
        """
        self.config = omega_conf_to_dataclass(config)
        if not isinstance(model_config, HFModelConfig):
            model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        # fp32 and eager attention: the same numerics as the CPU actor, so rollout and actor log-probs agree.
        self.model = AutoModelForCausalLM.from_pretrained(
            model_config.local_path, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        # Drop the checkpoint's generation defaults (e.g. top_k=50, a preset temperature): only the request's
        # sampling_params may shape the distribution, as in vLLM.
        eos = model_config.generation_config.eos_token_id if model_config.generation_config else None
        eos = eos if eos is not None else model_config.tokenizer.eos_token_id
        self.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
        self.model.generation_config = GenerationConfig(eos_token_id=self.eos_token_ids)
        # rollout.seed seeds sampling, as verl's vLLM servers do (vLLM's `seed`): runs with different seeds sample
        # differently, and a run's samples repeat given the order of its requests (one at a time, below)
        torch.manual_seed(int(self.config.seed) + replica_rank)
        self.global_steps: Optional[int] = None
        self._lock = asyncio.Lock()
        hf_kwargs = dict((self.config.engine_kwargs or {}).get("hf") or {})
        self.max_batch_size = int(hf_kwargs.get("max_batch_size", 1))
        if self.max_batch_size < 1:
            raise ValueError(f"rollout.engine_kwargs.hf.max_batch_size must be >= 1, got {self.max_batch_size}")
        self._pending: list[tuple[list[int], dict, asyncio.Future]] = []
        self._drainer: Optional[asyncio.Task] = None

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        **kwargs,
    ) -> TokenOutput:
        """Sample one response; honours temperature (0 = greedy), top_p, top_k, max_tokens, stop_token_ids."""
        assert image_data is None and video_data is None, "the hf rollout is text-only"
        if self.max_batch_size == 1:
            async with self._lock:
                token_ids, log_probs = await asyncio.to_thread(self._generate, list(prompt_ids), dict(sampling_params))
        else:
            future = asyncio.get_running_loop().create_future()
            self._pending.append((list(prompt_ids), dict(sampling_params), future))
            if self._drainer is None or self._drainer.done():
                self._drainer = asyncio.create_task(self._drain())
            token_ids, log_probs = await future
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    @staticmethod
    def _batch_key(sampling_params: dict[str, Any]) -> tuple:
        """Requests with the same key may share one generate call."""
        return tuple(sorted((k, str(v)) for k, v in sampling_params.items()))

    async def _drain(self):
        """Serve the queued requests in batches of up to ``max_batch_size`` with the same sampling parameters."""
        while self._pending:
            await asyncio.sleep(0.01)  # requests of one rollout arrive together: let them queue
            key = self._batch_key(self._pending[0][1])
            batch = [r for r in self._pending if self._batch_key(r[1]) == key][: self.max_batch_size]
            for request in batch:
                self._pending.remove(request)
            try:
                async with self._lock:
                    results = await asyncio.to_thread(self._generate_batch, [r[0] for r in batch], batch[0][1])
            except Exception as err:  # noqa: BLE001  every caller of the batch gets the error
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                continue
            for (_, _, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)

    def _max_tokens(self, prompt_len: int, sampling_params: dict[str, Any]) -> int:
        max_tokens = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        budget = self.config.prompt_length + self.config.response_length - prompt_len
        return max(1, min(max_tokens or self.config.response_length, budget))

    def _generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> tuple[list[int], list[float]]:
        return self._generate_batch([prompt_ids], sampling_params)[0]

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], sampling_params: dict[str, Any]
                        ) -> list[tuple[list[int], list[float]]]:
        """Sample one response per prompt in one left-padded generate call; each row's tokens up to and including its
        first stop token, and their log-probs."""
        width = max(len(p) for p in prompts)
        max_tokens = min(self._max_tokens(len(p), sampling_params) for p in prompts)
        temperature = float(sampling_params.get("temperature", 1.0))
        do_sample = temperature > 0
        # vLLM treats temperature 0 as greedy and reports unscaled log-probs for it.
        scale = temperature if do_sample else 1.0
        top_k = int(sampling_params.get("top_k") or -1)
        eos = self.eos_token_ids + list(sampling_params.get("stop_token_ids") or [])
        pad = eos[0]
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = self.model.generate(
            ids,
            attention_mask=mask,
            do_sample=do_sample,
            temperature=temperature if do_sample else None,
            top_p=float(sampling_params.get("top_p", 1.0)) if do_sample else None,
            top_k=max(top_k, 0) if do_sample else None,  # 0 disables top-k; None would mean HF's default 50
            max_new_tokens=max_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            output_logits=True,  # raw logits of each step, before temperature/top-p
            return_dict_in_generate=True,
        )
        responses = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float()  # (batch, response_len, vocab)
        log_probs = torch.log_softmax(logits / scale, dim=-1).gather(-1, responses[..., None]).squeeze(-1)
        stops = set(eos)
        results = []
        for row, lp in zip(responses.tolist(), log_probs.tolist()):
            end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))  # finished rows are padded
            results.append((row[:end], lp[:end]))
        return results

    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: Optional[int] = None):
        """Load new weights (HF names, full tensors) from the trainer."""
        async with self._lock:
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
            # Tied embeddings legitimately miss lm_head; anything else means the names do not match.
            assert not unexpected, f"unexpected weights: {unexpected}"
            assert set(missing) <= {"lm_head.weight"}, f"weights not sent: {missing}"
            if global_steps is not None:
                self.global_steps = global_steps

    async def set_global_steps(self, global_steps: int):
        """Record the trainer's step; every later response carries it in ``extra_fields["global_steps"]``."""
        self.global_steps = global_steps

    # Control calls verl makes on every server. Nothing to free or pause on a CPU: the weights stay in host
    # memory, there is no KV cache between requests and requests are never aborted.
    async def wake_up(self, tags: Optional[list[str]] = None):
        pass

    async def sleep(self):
        pass

    async def clear_kv_cache(self):
        pass

    async def release_kv_cache(self):
        pass

    async def resume_kv_cache(self):
        pass

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False):
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self):
        pass

    async def start_profile(self, **kwargs):
        pass

    async def stop_profile(self):
        pass


class HFReplica(RolloutReplica):
    """One ``HFRolloutServer`` per replica. Single node only; tensor/pipeline parallel size must be 1."""

    async def launch_servers(self):
        """Start this replica's ``HFRolloutServer`` as a named Ray actor and wait until its model is loaded."""
        assert self.world_size == 1, "the hf rollout runs one process per replica (tp = dp = pp = 1)"
        name = _server_name(self.replica_rank, self.name_suffix)
        server = (
            ray.remote(HFRolloutServer)
            .options(name=name, max_concurrency=self.max_concurrency)
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # only an id for verl's load balancer: there is no HTTP endpoint
        await server.wake_up.remote()  # returns once the model is loaded


class HFServerAdapter(BaseRollout):
    """Worker-side rollout: pushes the trainer's weights to this worker's replica server."""

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, device_mesh, replica_rank: int = -1):
        """verl's ``BaseRollout`` arguments; the replica is the worker's dp rank (``replica_rank`` if no mesh)."""
        super().__init__(config, model_config, device_mesh)
        # Hybrid mode: one replica per data-parallel rank (world size per replica is 1).
        self.replica_rank = device_mesh["dp"].get_local_rank() if device_mesh is not None else replica_rank
        self._server = None

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps=None, **kwargs):
        """Gather the actor's weights (full named tensors, on the CPU) and load them into this worker's replica server.

        Every rank must call it: the weight generator all-gathers FSDP shards. LoRA and other wire formats are refused.
        """
        assert wire_format == "named_tensors", f"the hf rollout takes full named tensors, got {wire_format!r}"
        assert kwargs.get("peft_config") is None, "LoRA adapters are not supported by the hf rollout"
        # The generator all-gathers FSDP shards (a collective), so every rank must drain it.
        state_dict = {name: tensor.detach().cpu() async for name, tensor in ensure_async_iterator(weights)}
        if self._server is None:
            self._server = ray.get_actor(_server_name(self.replica_rank))
        await self._server.update_weights.remote(state_dict, global_steps)

    async def resume(self, tags: list[str]):
        """No-op: the server's weights stay in host memory, there is nothing to bring back."""
        pass

    async def release(self):
        """No-op: there is no device memory to free between rollouts."""
        pass
