"""verl plug-in, loaded by `import verl` in every process (entry point `verl.plugins: gapo` in pyproject.toml).

Importing it registers the policy losses `gapo` and `gapo_token`. The GAPO trainer
(`gapo.verl_plugin.trainer`, trainer mode `gapo`) is heavier to import and is loaded only where it is
needed: `recipe.main_gapo` adds it to the Ray workers' VERL_USE_EXTERNAL_MODULES. With VERL_PLATFORM=cpu
(development and tests only) the CPU platform and the HF rollout server are registered too.
"""

import os

from gapo.verl_plugin import losses  # noqa: F401  (registers gapo, gapo_token)

if os.environ.get("VERL_PLATFORM", "").lower() == "cpu":
    import gapo.cpu  # noqa: F401
