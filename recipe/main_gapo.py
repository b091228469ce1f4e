"""Entry point: `python -m recipe.main_gapo [--config-name NAME] [hydra overrides...]`.

verl's own PPO entry point with GAPO's config (configs/gapo_trainer.yaml, extending verl's ppo_trainer)
and GAPO's start-up checks (the command line, before hydra: an unknown experiment or key, with the closest names,
gapo.verl_plugin.validate.command_line_problem; config: gapo.verl_plugin.validate; data, model, a CPU preset's
env vars and GPUs: gapo.verl_plugin.preflight, before GPU time is spent); the training loop is verl's v1 trainer,
run in mode `gapo` (`gapo.verl_plugin.trainer.GAPOTrainer`). Presets: `--config-name smoke_cpu` (tiny model on CPU).
"""

import os
import sys
import traceback

import hydra
import ray
from hydra.core.hydra_config import HydraConfig
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from gapo.verl_plugin.lost_members import NodeWatchdog, explain, lost_members
from gapo.verl_plugin.preflight import PreflightError, check_cluster_gpus, run_driver_checks, skip_hint
from gapo.verl_plugin.validate import GAPOConfigError, command_line_problem, validate_gapo_config


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
DEFAULT_CONFIG = "gapo_trainer"


@hydra.main(config_path=CONFIG_DIR, config_name=DEFAULT_CONFIG, version_base=None)
def main(config):
    """`python -m recipe.main_gapo [--config-name ...] [overrides]`: validate, preflight, then verl's run_ppo."""
    auto_set_device(config)
    try:
        validate_gapo_config(config)
    except GAPOConfigError as err:
        sys.exit(f"GAPO config error: {err}")
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    try:
        # data files, data_source values, model path, resume's world size, a CPU preset's env vars: before Ray
        run_driver_checks(config, platform=HydraConfig.get().runtime.choices.get("platform"))
        NodeWatchdog().start()  # a node lost mid-run ends the run, named, instead of a wait for its rollouts
        run_ppo(config, task_runner_class=GAPOTaskRunner)
    except PreflightError as err:  # from the task runner it arrives as a RayTaskError that is a PreflightError
        problems = getattr(err, "cause", err)
        sys.exit(f"GAPO preflight failed ({skip_hint()}):\n{problems}")
    except Exception as err:
        # a lost node or killed worker often surfaces as a survivor's error (gloo's "Connection closed by peer"):
        # ask Ray what died and say so (gapo/verl_plugin/lost_members.py); the task runner itself may be the one lost
        found = lost_members(err) if ray.is_initialized() else []
        if not found:
            raise
        traceback.print_exc()
        sys.exit(f"GAPO: {explain(err, found)}")


def cli():
    """The command line: an unknown experiment or an override of a key the config lacks ends here, in a line naming
    the closest names (`command_line_problem`); anything else goes to hydra unchanged."""
    problem = command_line_problem(sys.argv[1:], CONFIG_DIR, DEFAULT_CONFIG)
    if problem:
        sys.exit(f"GAPO config error: {problem}")
    main()


if __name__ == "__main__":
    cli()
