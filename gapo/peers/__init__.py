"""The adaptive-clip peers GAPO is compared with, as pure-torch rules (docs/peers.md): each module holds one peer's
bounds, computed from the tensors verl's policy loss receives, for `gapo.surrogate` to clip with. The peers that verl
0.9.1 has built in (SAPO, DPPO, CISPO, Clip-Cov, KL-Cov) run from verl's registry and are not rewritten here."""

from gapo.peers.builtin import BUILTIN_PEERS, DIAGNOSED_SUFFIX

# verl loss modes of the peers GAPO's trainer runs with its diagnostics (registered by gapo.verl_plugin.losses): the
# ported ones, and verl's built-in ones wrapped (`<name>_diagnosed`: verl's loss, GAPO's per-c sums beside it)
PEER_LOSS_MODES = ("dcpo", "bapo", *(peer + DIAGNOSED_SUFFIX for peer in BUILTIN_PEERS))
