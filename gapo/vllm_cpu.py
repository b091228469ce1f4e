"""vLLM general plug-in: keep the weights of unquantized linear layers on vLLM's CPU platform reloadable.

Registered under the entry point group ``vllm.general_plugins`` (pyproject.toml), so vLLM calls
:func:`register` in every process that builds an engine, verl's rollout server included. It acts on vLLM's
CPU platform only and is a no-op on every other platform (GPU installs load it too, and nothing changes).

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
"""

from __future__ import annotations

_MARK = "_gapo_keeps_cpu_weight"


def _keep_weight_after_packing(self, layer) -> None:
    """``UnquantizedLinearMethod.process_weights_after_loading`` on CPU, with the weight kept for reloads."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)


setattr(_keep_weight_after_packing, _MARK, True)


def register() -> None:
    """vLLM's plug-in hook: patch the CPU linear method once per process (vLLM may call this several times)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    if getattr(UnquantizedLinearMethod.process_weights_after_loading, _MARK, False):
        return
    UnquantizedLinearMethod.process_weights_after_loading = _keep_weight_after_packing
