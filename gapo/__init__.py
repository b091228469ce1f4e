"""GAPO: Group Adaptive Clipping Policy Optimization (framework-agnostic core, pure torch).

- `adaptive_eps_high`: the per-rollout upper clip as a function of the group's success count;
- `sequence_clipped_surrogate` / `token_clipped_surrogate`: the clipped losses using it;
- `GAPOConfig`: the knobs and their defaults.
The verl adapter lives in `gapo.verl_plugin` (registered on `import verl`).
"""

from gapo.config import GAPOConfig
from gapo.surrogate import SurrogateTerms, sequence_clipped_surrogate, token_clipped_surrogate
from gapo.threshold import SCHEDULES, adaptive_eps_high

__all__ = [
    "GAPOConfig",
    "SCHEDULES",
    "SurrogateTerms",
    "adaptive_eps_high",
    "sequence_clipped_surrogate",
    "token_clipped_surrogate",
]
