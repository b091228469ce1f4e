"""Entry point: `python -m recipe.main_gapo [--config-name NAME] [hydra overrides...]`.

verl's own PPO entry point with GAPO's config (configs/gapo_trainer.yaml, extending verl's ppo_trainer)
and GAPO's start-up checks (config: gapo.verl_plugin.validate; data, model and GPUs:
gapo.verl_plugin.preflight, before GPU time is spent); the training loop is verl's v1 trainer, run in mode `gapo`
(`gapo.verl_plugin.trainer.GAPOTrainer`). Presets: `--config-name smoke_cpu` (tiny model on CPU).
"""

import os
import sys
import traceback

import hydra
import ray
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from gapo.verl_plugin.lost_members import NodeWatchdog, explain, lost_members
from gapo.verl_plugin.preflight import PreflightError, check_cluster_gpus, run_driver_checks
from gapo.verl_plugin.validate import GAPOConfigError, validate_gapo_config

@ray.remote
class GAPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's v1 task runner, with trainer mode `gapo` registered in its Ray process before it looks it up."""

    def run(self, config):
        """Check the cluster's GPUs, register GAPOTrainer, then run verl's task runner."""
        # Here, in the process where verl builds its resource pools: the cluster must hold them, or verl's
        # placement groups could wait forever (PreflightError reaches the driver through ray.get in run_ppo).
        check_cluster_gpus(config)
        import gapo.verl_plugin.trainer  # noqa: F401  (registers GAPOTrainer)

        return super().run(config)


CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


@hydra.main(config_path=CONFIG_DIR, config_name="gapo_trainer", version_base=None)
def main(config):
    """`python -m recipe.main_gapo [--config-name ...] [overrides]`: validate, preflight, then verl's run_ppo."""
    auto_set_device(config)
    try:
        validate_gapo_config(config)
    except GAPOConfigError as err:
        sys.exit(f"GAPO config error: {err}")
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    try:
        run_driver_checks(config)  # data files, data_source values, model path, resume's world size: before Ray
        NodeWatchdog().start()  # a node lost mid-run ends the run, named, instead of a wait for its rollouts
        run_ppo(config, task_runner_class=GAPOTaskRunner)
    except PreflightError as err:  # from the task runner it arrives as a RayTaskError that is a PreflightError
        problems = getattr(err, "cause", err)
        sys.exit(f"GAPO preflight failed (GAPO_SKIP_PREFLIGHT=data,model,checkpoint,gpu skips checks):\n{problems}")
    except Exception as err:
        # a lost node or killed worker often surfaces as a survivor's error (gloo's "Connection closed by peer"):
        # ask Ray what died and say so (gapo/verl_plugin/lost_members.py); the task runner itself may be the one lost
        found = lost_members(err) if ray.is_initialized() else []
        if not found:
            raise
        traceback.print_exc()
        sys.exit(f"GAPO: {explain(err, found)}")


if __name__ == "__main__":
    main()
