"""vLLM general plug-ins: keep the weights of unquantized linear layers on vLLM's CPU platform reloadable, and run
vLLM's compiled sampler helpers eagerly there.

Registered under the entry point group ``vllm.general_plugins`` (pyproject.toml: ``gapo_cpu_weights``,
:func:`register`, and ``gapo_cpu_eager_sampler``, :func:`register_eager_sampler`), so vLLM calls both in every
process that builds an engine, verl's rollout server included (``VLLM_PLUGINS`` may name either alone). Each acts
on vLLM's CPU platform only and is a no-op on every other platform (GPU installs load them too, and nothing changes).

Why: after loading a model, vLLM's CPU backend packs each unquantized linear layer for oneDNN (or its other
CPU GEMM kernels) and then *replaces the weight with an empty tensor*
(``UnquantizedLinearMethod.process_weights_after_loading`` calls
``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``, vllm 0.24.0,
``vllm/model_executor/layers/linear.py``). Serving never reads the weight again, but RL training does: after
every actor update verl loads the new weights into the running engine (``model.load_weights``), which copies
into each parameter. With the weight gone, the second sync fails ("Attempted to load weight
(torch.Size([64, 64])) into parameter (torch.Size([0]))") and verl's trainer hangs instead of exiting.

The fix keeps the weight (``remove_weight=False``): the same packing, one extra copy of each linear weight in
host memory. verl calls ``process_weights_after_loading`` again after each sync, which re-packs the new values,
so the engine samples from the updated policy (tests/vllm/ check rollout/actor log-prob agreement after
every step).

The second plug-in, on the CPU platform only: vLLM's sampler helpers that it wraps in ``torch.compile`` (``compiled_random_sample``,
the sample of requests without a seed of their own, in ``vllm/v1/sample/ops/topk_topp_sampler.py``, and
``batched_count_greater_than``, the rank of each returned log-prob, in ``vllm/v1/sample/ops/logprobs.py``) run as the
plain functions they wrap. The same torch ops, eagerly: with ``enforce_eager`` (every CPU setting of this project)
they are the only code vLLM compiles, and inductor compiles C++ for them when the engine starts (the warm-up's dummy
sampler run: 16.6 s of a 28.2 s in-process engine start for the tiny model, cProfile) and again at the first log-prob
request, once per engine process. On tensors of one batch x vocabulary on CPU the eager ops take milliseconds.
"""

from __future__ import annotations

_MARK = "_gapo_keeps_cpu_weight"


def _keep_weight_after_packing(self, layer) -> None:
    """``UnquantizedLinearMethod.process_weights_after_loading`` on CPU, with the weight kept for reloads."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)


setattr(_keep_weight_after_packing, _MARK, True)


# (module, name) of each torch.compile'd sampler helper run eagerly on CPU; sampler.py imports the second by name
_EAGER_ON_CPU = (("vllm.v1.sample.ops.topk_topp_sampler", "compiled_random_sample"),
                 ("vllm.v1.sample.ops.logprobs", "batched_count_greater_than"),
                 ("vllm.v1.sample.sampler", "batched_count_greater_than"))


def _run_sampler_helpers_eagerly() -> None:
    """Replace each of :data:`_EAGER_ON_CPU` that is a ``torch.compile`` wrapper by the function it wraps (a vLLM
    without one of them, or with a plain function there, is left as it is)."""
    import importlib

    for module_name, name in _EAGER_ON_CPU:
        module = importlib.import_module(module_name)
        eager = getattr(getattr(module, name, None), "_torchdynamo_orig_callable", None)
        if eager is not None:
            setattr(module, name, eager)


def register() -> None:
    """vLLM's plug-in hook ``gapo_cpu_weights``: patch the CPU linear method once per process (vLLM may call this
    several times)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    if getattr(UnquantizedLinearMethod.process_weights_after_loading, _MARK, False):
        return
    UnquantizedLinearMethod.process_weights_after_loading = _keep_weight_after_packing


def register_eager_sampler() -> None:
    """vLLM's plug-in hook ``gapo_cpu_eager_sampler``: on the CPU platform, vLLM's compiled sampler helpers run as
    the functions they wrap (idempotent: an unwrapped helper is left as it is)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        _run_sampler_helpers_eagerly()
