"""The adaptive-clip peers GAPO is compared with, as pure-torch rules (docs/peers.md): each module holds one peer's
bounds, computed from the tensors verl's policy loss receives, for `gapo.surrogate` to clip with. The peers that verl
0.9.1 has built in (SAPO, DPPO, CISPO, Clip-Cov, KL-Cov) run from verl's registry and are not rewritten here."""

# verl loss modes of the peers ported here (registered by gapo.verl_plugin.losses)
PEER_LOSS_MODES = ("dcpo", "bapo")
