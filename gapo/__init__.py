"""GAPO: Group Adaptive Clipping Policy Optimization (framework-agnostic core, pure torch).

- `adaptive_eps_high`: the per-rollout upper clip as a function of the group's success count;
- `sequence_clipped_surrogate` / `token_clipped_surrogate`: the clipped losses using it;
- `GAPOConfig`: the knobs and their defaults.
The verl adapter lives in `gapo.verl_plugin` (registered on `import verl`).

The names below load on first use: importing a torch-free submodule (`gapo.supervisor`, which `python -m eval`
uses in a process that only waits) does not load torch.
"""

from importlib import import_module

_EXPORTS = {
    "GAPOConfig": "gapo.config",
    "SCHEDULES": "gapo.threshold",
    "SurrogateTerms": "gapo.surrogate",
    "adaptive_eps_high": "gapo.threshold",
    "sequence_clipped_surrogate": "gapo.surrogate",
    "token_clipped_surrogate": "gapo.surrogate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gapo' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
