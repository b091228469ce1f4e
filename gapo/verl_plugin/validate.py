"""Start-up checks of a GAPO training config: each failure names the key and the fix, before any Ray work."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re

from hydra.errors import ConfigCompositionException, InstantiationException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from verl.trainer.distillation import is_distillation_enabled
from verl.utils.config import omega_conf_to_dataclass

from gapo.config import GAPOConfig
from gapo.config_names import unknown_experiment, unknown_key
from gapo.step_metrics import VAL_COVERAGE_KEY
from gapo.verl_plugin.config import resolve_gapo_clips
from gapo.verl_plugin.losses import DIAGNOSED_LOSS_MODES
from gapo.verl_plugin.vigor import VigorConfigError, vigor_settings

GAPO_TRAINER_MODE = "gapo"
POLICY_LOSS_TARGET = "gapo.verl_plugin.config.GAPOPolicyLossConfig"


class GAPOConfigError(ValueError):
    """A training config that cannot work with GAPO."""


POLL_INTERVAL_KEY = "trainer.v1.sampler.poll_interval"


def sampler_poll_interval(config: DictConfig) -> float | None:
    """``trainer.v1.sampler.poll_interval`` (seconds), or None when unset (verl's replay buffer default, 2.0 s).

    verl's sync replay buffer waits for finished rollouts by polling TransferQueue and sleeping ``poll_interval``
    between polls (verl/trainer/ppo/v1/replay_buffer.py, ``ReplayBuffer._wait_for_next_poll``); verl passes no
    value, so every generation phase lasts a multiple of 2.0 s. On GPUs (generation takes tens of seconds) that
    costs ~1 s a step; on the CPU presets it was the whole of ``timing_s/gen``. GAPO's trainer sets it from this key.
    """
    value = config.trainer.v1.sampler.get("poll_interval", None)
    if value is None:
        return None
    try:
        interval = float(value)
    except (TypeError, ValueError):
        interval = float("nan")
    if not 0 < interval <= 60:  # also rejects nan
        raise GAPOConfigError(f"{POLL_INTERVAL_KEY}={value!r}: seconds between polls for finished rollouts, a number "
                              "in (0, 60]; e.g. 0.05 (the CPU presets) or leave it unset for verl's 2.0")
    return interval


VAL_WINDOW_KEY = "trainer.val_window"


def validation_settings(config: DictConfig) -> tuple[float, int]:
    """(coverage threshold, window) for validation's pass@k metrics: ``trainer.val_coverage_threshold`` (a solve
    rate in [0, 1); default 0.05, as ``python -m eval --coverage-threshold``) and ``trainer.val_window`` (how many
    of the latest validations ``val-passk-window/*`` averages, >= 1; default 4): the paper's coverage figures are
    averages late in training, not one validation's value."""
    from gapo.passk import DEFAULT_COVERAGE_THRESHOLD

    threshold = config.trainer.get("val_coverage_threshold", DEFAULT_COVERAGE_THRESHOLD)
    window = config.trainer.get("val_window", 4)
    try:
        ok = 0 <= float(threshold) < 1
    except (TypeError, ValueError):
        ok = False
    if not ok:  # also rejects nan
        raise GAPOConfigError(f"{VAL_COVERAGE_KEY}={threshold!r}: a solve rate in [0, 1) above which a validation "
                              "problem counts as covered; e.g. 0.05 (the paper's 5%)")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise GAPOConfigError(f"{VAL_WINDOW_KEY}={window!r}: the number of latest validations to average, an "
                              "integer >= 1; e.g. 4 (1 logs each validation alone)")
    return float(threshold), window


EXPLORATION_KEY = "exploration"


def exploration_settings(config: DictConfig):
    """The exploration instruments' settings from the top-level ``exploration`` group (configs/base/gapo.yaml;
    `gapo.exploration.ExplorationConfig`'s defaults where it is absent). ``coverage_threshold`` defaults to validation's
    ``trainer.val_coverage_threshold``, so training-time and validation coverage use one threshold.

    Raises GAPOConfigError naming the key, the bad value and the fix (an unknown key: the valid ones).
    """
    from dataclasses import fields

    from gapo.exploration import ExplorationConfig

    group = config.get(EXPLORATION_KEY, None)
    values = dict(group) if group is not None else {}
    known = [f.name for f in fields(ExplorationConfig)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise GAPOConfigError(unknown_key(f"{EXPLORATION_KEY}.{unknown[0]}", known,
                                          "a key of the exploration instruments") + " (docs/metrics.md)")
    if "coverage_threshold" not in values:
        values["coverage_threshold"] = validation_settings(config)[0]
    try:
        return ExplorationConfig(**values)
    except ValueError as err:
        raise GAPOConfigError(str(err)) from None


def _dataclass_fields(target) -> list[str] | None:
    """The constructor's keyword names of the dataclass that a ``_target_`` names; None for anything else."""
    from hydra.utils import get_class

    try:
        cls = get_class(str(target))
    except (ImportError, ValueError):  # not importable here, or not a class: verl reports it when it builds the node
        return None
    if not dataclasses.is_dataclass(cls):
        return None
    return [f.name for f in dataclasses.fields(cls) if f.init]


def unknown_field(node, key: str, where: str) -> str | None:
    """The message when the config node `node` (a plain dict, at `where`) has a ``_target_`` dataclass with no field
    `key`, naming the closest fields; else None. verl would fail building that dataclass only after Ray started, with
    a TypeError that names neither the node nor the fix."""
    if not isinstance(node, dict) or "_target_" not in node:
        return None
    fields = _dataclass_fields(node["_target_"])
    if fields is None or key in fields:
        return None
    name = str(node["_target_"]).rsplit(".", 1)[-1]
    return unknown_key(f"{where}.{key}" if where else key, fields, f"a key of {name} ({where}._target_)")


def check_gapo_node_keys(config: DictConfig) -> None:
    """Raise GAPOConfigError for a key that a node with one of GAPO's ``_target_`` dataclasses (``gapo.*``: the
    policy_loss of the GAPO losses, the focal estimator's algorithm) does not have as a field, e.g. a misspelt
    ``+actor_rollout_ref.actor.policy_loss.eps_hgh_max=...`` or a misspelt key in an experiment's yaml. verl's own
    nodes carry keys their dataclasses lack (e.g. actor_rollout_ref.ref.log_prob_*), so they are not checked here;
    a ``+key`` under them is refused on the command line (`command_line_problem`)."""

    def walk(node, path):
        if not isinstance(node, dict):
            return
        owned = str(node.get("_target_", "")).startswith("gapo.")
        for key, value in node.items():
            problem = unknown_field(node, key, path) if owned else None
            if problem:
                raise GAPOConfigError(problem)
            walk(value, f"{path}.{key}" if path else str(key))

    walk(OmegaConf.to_container(config, resolve=False), "")


_NOT_OVERRIDDEN = re.compile(r"^Could not override '([^']+)'\.")


def _unknown_override_key(err: ConfigCompositionException) -> str | None:
    """The key of an override that names a key the config lacks (hydra: "Could not override 'KEY'", caused by
    omegaconf's "Key ... is not in struct"), else None."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    match = _NOT_OVERRIDDEN.match(str(err))
    return match.group(1) if match and isinstance(err.__cause__, (ConfigKeyError, ConfigAttributeError)) else None


def unknown_override(config: dict, key: str, line: str, groups=()) -> str:
    """The message for the override `line` of `key`, which the composed `config` (a plain container) lacks: the
    first part of the key that is not there, with the closest keys at that level (top level: config groups too)."""
    parts = key.split(".")
    node = config
    for i, part in enumerate(parts):
        where = ".".join(parts[: i + 1])
        if not isinstance(node, dict):
            at = ".".join(parts[:i])
            return f"{at} is a value ({node!r}), not a group of keys (override {line}): set it as {at}=<value>"
        if part not in node:
            names = [*node, *groups] if i == 0 else list(node)
            return f"{unknown_key(where, names, addable='_target_' not in node)} (override {line})"
        node = node[part]
    return f"cannot override {key} (override {line})"


def added_field_problem(config: dict, key: str, line: str) -> str | None:
    """For a ``+key=value`` override that hydra accepted: the message when a part of `key` was added under a node
    with a ``_target_`` dataclass that has no such field (verl's or GAPO's), else None."""
    parts = key.split(".")
    node = config
    for i, part in enumerate(parts):
        problem = unknown_field(node, part, ".".join(parts[:i]))
        if problem:
            return f"{problem} (override {line})"
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return None


def command_line_problem(argv: list[str], config_dir: str, default_config: str) -> str | None:
    """What is wrong with a ``python -m recipe.main_gapo`` command line that hydra would refuse without naming the
    fix, or accept only to fail later: an unknown experiment (`gapo.config_names.unknown_experiment`: the closest
    names and the list), overrides of keys the config lacks (hydra's advice is to add them with ``+``), and ``+key``
    overrides that add a key a dataclass-backed node has no field for; each names the closest keys at its level, from
    the composed config. None when the line composes, and for whatever hydra handles itself (--help, --info,
    --multirun, --config-path, --config-dir, a line its parser refuses, any other composition error): hydra then runs
    exactly as it would have. Costs one composition (~0.3 s), and one more per unknown key."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = get_args_parser().parse_args(argv)
        parsed = OverridesParser.create().parse_overrides(args.overrides)
    except (SystemExit, OverrideParseException):  # hydra says it again, in its own words
        return None
    if (args.help or args.hydra_help or args.info or args.shell_completion or args.multirun or args.config_path
            or args.config_dir or args.experimental_rerun):
        return None
    name = args.config_name or default_config
    problem = unknown_experiment(name, config_dir)
    if problem:
        return problem
    overrides = list(zip(args.overrides, parsed))
    keyless = [ln for ln, o in overrides if not o.key_or_group]  # hydra's parser takes `=5`; its compose tracebacks
    if keyless:
        return "\n".join(f"override {ln!r} names no key: write KEY=VALUE (e.g. trainer.nnodes=1)" for ln in keyless)
    if not overrides:  # the experiment exists and nothing overrides it: nothing to compose here
        return None
    bad: list[str] = []
    for _ in range(len(overrides) + 1):  # a composition stops at the first unknown key: drop it and compose again
        try:
            with initialize_config_dir(config_dir=config_dir, version_base=None):
                config = compose(name, overrides=[ln for ln, o in overrides if o.key_or_group not in bad],
                                 return_hydra_config=True)
            break
        except ConfigCompositionException as err:
            key = _unknown_override_key(err)
            if key is None or key in bad:
                return None
            bad.append(key)
        except Exception:  # any other composition error: hydra's own report, as without this check
            return None
    else:
        return None
    groups = [g for g in config.hydra.runtime.choices if "/" not in g and "@" not in g]
    plain = OmegaConf.to_container(config, resolve=False)
    problems = [unknown_override(plain, o.key_or_group, ln, groups) for ln, o in overrides if o.key_or_group in bad]
    problems += [added_field_problem(plain, o.key_or_group, ln) for ln, o in overrides if o.is_add()]
    return "\n".join(p for p in problems if p) or None


def validate_gapo_config(config: DictConfig) -> None:
    """Raise GAPOConfigError for a config GAPO cannot train with. Baseline losses pass through unchecked, except
    for the trainer's own knobs (the replay buffer's poll interval, validation's coverage threshold and window,
    the `exploration` instruments, VIGOR's `vigor` group), which every run of GAPO's trainer reads."""
    check_gapo_node_keys(config)
    sampler_poll_interval(config)
    validation_settings(config)
    exploration_settings(config)
    try:
        vigor_settings(config)  # VIGOR (top-level `vigor`): composes with every loss_mode, so checked for all
    except VigorConfigError as err:
        raise GAPOConfigError(str(err)) from None
    actor = config.actor_rollout_ref.actor
    loss_mode = actor.policy_loss.get("loss_mode", "vanilla")
    if loss_mode not in DIAGNOSED_LOSS_MODES:
        return
    trainer_mode = config.trainer.v1.get("trainer_mode", "sync")
    if not config.trainer.get("use_v1", True) or trainer_mode != GAPO_TRAINER_MODE:
        raise GAPOConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} needs the GAPO trainer, but "
            f"trainer.v1.trainer_mode={trainer_mode} (trainer.use_v1={config.trainer.get('use_v1', True)}): set "
            f"trainer.use_v1=true trainer.v1.trainer_mode={GAPO_TRAINER_MODE} (configs/gapo_trainer.yaml does), "
            "or pick a non-GAPO loss_mode"
        )
    if is_distillation_enabled(config.get("distillation")):
        raise GAPOConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} cannot be combined with on-policy distillation "
            "(distillation.enabled=true): GAPO's actor loss would replace verl's distillation loss, and verl's "
            "distillation loss cannot run a GAPO policy loss. Set distillation.enabled=false, or pick a non-GAPO "
            "loss_mode (e.g. actor_rollout_ref.actor.policy_loss.loss_mode=gspo) to distil"
        )
    target = actor.policy_loss.get("_target_", "")
    if target != POLICY_LOSS_TARGET:
        raise GAPOConfigError(
            f"actor_rollout_ref.actor.policy_loss._target_={target!r} has no GAPO fields: set it to {POLICY_LOSS_TARGET}"
        )
    n = config.actor_rollout_ref.rollout.n
    if n < 2:
        raise GAPOConfigError(
            f"actor_rollout_ref.rollout.n={n}: GAPO needs groups of at least 2 rollouts per prompt (the paper uses 8)"
        )
    try:
        settings: GAPOConfig = omega_conf_to_dataclass(actor.policy_loss)
        resolve_gapo_clips(actor, settings)
    except (ValueError, TypeError, InstantiationException) as err:
        cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ else err
        raise GAPOConfigError(f"invalid GAPO settings under actor_rollout_ref.actor: {cause}") from err
