"""verl plug-in, loaded by `import verl` in every process (entry point `verl.plugins: gapo` in pyproject.toml).

Importing it registers the policy losses `gapo` and `gapo_token` and the advantage estimator `focal_grpo`
(the focal F-GSPO baseline). The GAPO trainer
(`gapo.verl_plugin.trainer`, trainer mode `gapo`) imports most of verl's trainer, so it is loaded only
where the trainer is built: `recipe.main_gapo`'s task runner imports it. With VERL_PLATFORM=cpu
(development and tests only) the CPU platform and the HF rollout server are registered too. First of all, it lowers
verl's optional-engine and platform start-up messages (`gapo.verl_plugin.quiet`, which names them).
"""

import os

from gapo.verl_plugin.quiet import quiet_verl_startup

quiet_verl_startup()  # before the imports below: they import verl's modules that warn

from gapo.verl_plugin import advantage, losses  # noqa: F401  (registers focal_grpo; gapo, gapo_token)

if os.environ.get("VERL_PLATFORM", "").lower() == "cpu":
    import gapo.cpu  # noqa: F401
