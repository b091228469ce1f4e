"""Reproduce one of the paper's tables: every run's exact command, their submission, and the filled table.

    python -m recipe.reproduce TABLE [--nodes N] [--gpus-per-node G] [--ckpt-root DIR] [OVERRIDES...]
        print every run's training command (config plus cluster overrides) and its evaluation command
    python -m recipe.reproduce TABLE --submit --ckpt-root /shared/ckpt [--only CONFIG ...]
        submit the runs as Ray jobs through launch/submit.sh (RAY_ADDRESS must be set)
    python -m recipe.reproduce TABLE --fill [--eval-root runs/eval] [--allow-missing]
        the table in the paper's layout (one row per paper row), each cell ours (paper), from the
        summary.json files `python -m eval` wrote

TABLE: math (R1-Distill-Qwen-1.5B, the paper's main results and extra baselines), code (DeepCoder recipe),
ablation (GAPO's variants and the other models). OVERRIDES (hydra key=value) go to every run of the table.
Every run's config is composed and passes GAPO's and verl's start-up validation before it is printed or
submitted (`--no-check` skips that). Runs that start from an earlier stage's model (context lengthening) are
printed after the command that exports that model; `--submit` leaves them out (submit them with `--only`
once the earlier stage is done and exported). Paper numbers are the ones in our notes of the paper; a blank
means the notes give none.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"
SUBMIT_SCRIPT = ROOT / "launch" / "submit.sh"
DEFAULT_EVAL_ROOT = "runs/eval"
MERGED_MODEL_DIR = "merged_hf"  # where a stage's final checkpoint is exported for the next stage

# both AMC sets: amc22_23 (83 problems) is DeepScaleR's, the comparable one for R1-Distill runs; amc23 (40) is the
# "AMC23" of Qwen2.5-Math-style evaluations (docs/training.md, Math training step 1)
MATH_BENCHES = ("aime24", "aime25", "amc23", "amc22_23", "math500", "minerva", "olympiadbench")
CODE_BENCHES = ("livecodebench", "humanevalplus")
BENCH_LABELS = {"aime24": "AIME24", "aime25": "AIME25", "amc23": "AMC23", "amc22_23": "AMC (83)", "math500": "MATH500",
                "minerva": "Minerva",
                "olympiadbench": "OlympiadBench", "livecodebench": "LCB v5", "humanevalplus": "HumanEval+"}


class ReproduceError(ValueError):
    """Bad input: the message names the bad value and the fix."""


@dataclass(frozen=True)
class Row:
    """One row of a paper table.

    Attributes:
        label: the paper's row label (or ours, for runs the paper does not report, with `note` saying so).
        runs: configs under configs/ trained in order, each later one from the previous one's final model;
            empty for the base model, which is only evaluated.
        paper: the paper's numbers, {(benchmark, k): pass@k in %}; only numbers our notes give.
        model: the base model to evaluate (rows without runs).
        note: where the row comes from when not from the paper's results.
        trained_in: the table whose run this row shares (not submitted again here).
        eval_args: extra `python -m eval` arguments (e.g. the model's token budget).
        overrides: extra hydra overrides for this row's runs.
        name: the evaluation's folder name, when not the default (see `eval_name`).
    """

    label: str
    runs: tuple[str, ...] = ()
    paper: dict[tuple[str, int], float] = field(default_factory=dict)
    model: str | None = None
    note: str = ""
    trained_in: str | None = None
    eval_args: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    name: str | None = None

    @property
    def eval_name(self) -> str:
        """The evaluation's folder under the eval root: `name`, else the last run's name, or base_<model>."""
        if self.name:
            return self.name
        if self.runs:
            return self.runs[-1].split("/")[-1]
        return "base_" + self.model.split("/")[-1].lower()


@dataclass(frozen=True)
class Table:
    """One of the paper's tables: its rows (runs, paper numbers) and columns (benchmark, k), with the evaluation's
    benchmarks and arguments shared by every row."""

    name: str
    title: str
    benches: tuple[str, ...]
    columns: tuple[tuple[str, int], ...]  # (benchmark, k) per column
    rows: tuple[Row, ...]
    notes: tuple[str, ...] = ()
    eval_args: tuple[str, ...] = ()  # `python -m eval` arguments of every row; a row's own flag replaces the table's


MATH_COLUMNS = (("aime24", 1), ("aime24", 16), ("aime25", 1), ("aime25", 16), ("amc23", 1), ("amc22_23", 1),
                ("math500", 1), ("minerva", 1), ("olympiadbench", 1))
R1 = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
NOT_REPORTED = "extra baseline, not reported by the paper"
# samples per problem: 64 for the math tables (coverage above a 5% solve rate needs a problem solved >= 4 times; at
# eval's default 16 one success counts: docs/evaluation.md); the Qwen and Llama evaluations report up to pass@256
MATH_EVAL = ("--n", "64")
# Qwen2.5-Math-1.5B: 4k context (configs/model/qwen2.5_math_1.5b.yaml)
QWEN_EVAL = ("--max-new-tokens", "3072", "--n", "256")
LLAMA_EVAL = ("--max-new-tokens", "4096", "--n", "256")  # its training budget (configs/model/llama3.2_3b_instruct.yaml)

TABLES = {
    "math": Table(
        name="math",
        title="R1-Distill-Qwen-1.5B on math (DeepScaleR data, 24k-token rollouts): the paper's main results",
        benches=MATH_BENCHES,
        columns=MATH_COLUMNS,
        eval_args=MATH_EVAL,
        rows=(
            Row("base model", model=R1, paper={("aime24", 1): 28.5}),
            Row("fixed-clip baseline (GSPO)", ("math/r1_1.5b_gspo",),
                {("aime24", 1): 41.3, ("aime24", 16): 73.3, ("aime25", 1): 29.4, ("aime25", 16): 50.0}),
            Row("GAPO", ("math/r1_1.5b_gapo",),
                {("aime24", 1): 44.0, ("aime24", 16): 76.7, ("aime25", 1): 30.8, ("aime25", 16): 56.7}),
            Row("focal F-GSPO (advantage shaping)", ("math/r1_1.5b_focal_gspo",),
                {("aime24", 1): 40.2, ("aime24", 16): 73.3}),
            Row("symmetric fixed-clip GSPO (control for clip-higher)", ("math/r1_1.5b_gspo_symmetric",),
                note=NOT_REPORTED),
            Row("GRPO", ("math/r1_1.5b_grpo",), note=NOT_REPORTED),
            Row("DAPO clip-higher", ("math/r1_1.5b_dapo",), note=NOT_REPORTED),
            Row("DCPO dynamic clip (peer)", ("math/r1_1.5b_dcpo",), note=NOT_REPORTED),
            Row("BAPO adaptive clip (peer)", ("math/r1_1.5b_bapo",), note=NOT_REPORTED),
            Row("SAPO soft gate (peer)", ("math/r1_1.5b_sapo",), note=NOT_REPORTED),
            Row("DPPO-Binary-TV (peer)", ("math/r1_1.5b_dppo_tv",), note=NOT_REPORTED),
            Row("DPPO-Binary-KL (peer)", ("math/r1_1.5b_dppo_kl",), note=NOT_REPORTED),
            Row("CISPO (peer)", ("math/r1_1.5b_cispo",), note=NOT_REPORTED),
            Row("KL-Cov (peer)", ("math/r1_1.5b_kl_cov",), note=NOT_REPORTED),
            Row("Dr.GRPO", ("math/r1_1.5b_drgrpo",), note=NOT_REPORTED),
            Row("token-level focal F-GRPO", ("math/r1_1.5b_focal_grpo",), note=NOT_REPORTED),
        ),
        notes=("Late in training GAPO keeps 10.9 problems above a 5% solve rate vs 6.7-8.6 for the baselines "
               "(paper; a training-time metric, val-passk/*/coverage@5% in the logs, not in this table).",),
    ),
    "code": Table(
        name="code",
        title="R1-Distill-Qwen-1.5B on code (DeepCoder recipe, 16k then 32k context)",
        benches=CODE_BENCHES,
        columns=(("livecodebench", 1), ("humanevalplus", 1)),
        rows=(
            Row("base model", model=R1, paper={("livecodebench", 1): 16.9, ("humanevalplus", 1): 58.3},
                name="base_deepseek-r1-distill-qwen-1.5b_code"),  # not the math table's evaluation folder
            Row("DeepCoder recipe (baseline), 16k -> 32k", ("code/r1_1.5b_deepcoder", "code/r1_1.5b_deepcoder_32k"),
                {("livecodebench", 1): 22.4, ("humanevalplus", 1): 68.2}),
            Row("GAPO at token level on the DeepCoder recipe, 16k -> 32k",
                ("code/r1_1.5b_gapo_token", "code/r1_1.5b_gapo_token_32k"),
                {("livecodebench", 1): 24.8, ("humanevalplus", 1): 71.7}),
        ),
        notes=("HumanEval+: our notes give the paper's number without its k; read here as pass@1.",),
    ),
    "ablation": Table(
        name="ablation",
        title="Ablations and other models",
        benches=MATH_BENCHES,
        columns=MATH_COLUMNS,
        eval_args=MATH_EVAL,
        rows=(
            Row("Qwen2.5-Math-1.5B: GAPO, sequence level, eps_high_max 5e-3", ("math/qwen_math_1.5b_gapo",),
                eval_args=QWEN_EVAL),
            Row("Qwen2.5-Math-1.5B: fixed-clip GSPO (3e-3, 5e-3)", ("math/qwen_math_1.5b_gspo",), eval_args=QWEN_EVAL),
            Row("Qwen2.5-Math-1.5B: GAPO, token level (0.2, 0.28)", ("math/qwen_math_1.5b_gapo_token",),
                eval_args=QWEN_EVAL),
            Row("Qwen2.5-Math-1.5B: GAPO, eps_high_max 3e-3 (= eps_low)", ("math/qwen_math_1.5b_gapo_ehmax_3e-3",),
                eval_args=QWEN_EVAL),
            Row("Qwen2.5-Math-1.5B: GAPO, eps_high_max 5.25e-3", ("math/qwen_math_1.5b_gapo_ehmax_5.25e-3",),
                eval_args=QWEN_EVAL),
            Row("Qwen2.5-Math-1.5B: GAPO, eps_high_max 7e-3", ("math/qwen_math_1.5b_gapo_ehmax_7e-3",),
                eval_args=QWEN_EVAL),
            Row("Llama-3.2-3B-Instruct: GAPO", ("math/llama3.2_3b_gapo",), eval_args=LLAMA_EVAL),
            Row("Llama-3.2-3B-Instruct: fixed-clip GSPO", ("math/llama3.2_3b_gspo",), eval_args=LLAMA_EVAL),
            Row("R1-Distill-1.5B: GAPO, k = 8 (the math table's GAPO run)", ("math/r1_1.5b_gapo",), trained_in="math"),
            Row("R1-Distill-1.5B: GAPO, k = 4 (same rollouts per step)", ("math/r1_1.5b_gapo_k4",)),
            Row("R1-Distill-1.5B: GAPO, k = 16 (same rollouts per step)", ("math/r1_1.5b_gapo_k16",)),
            Row("R1-Distill-1.5B: fixed clip in GAPO's code path (schedule constant)", ("math/r1_1.5b_gapo_constant",)),
            Row("R1-Distill-1.5B: GAPO, context lengthening 8k -> 16k -> 24k",
                ("math/r1_1.5b_gapo_stage1_8k", "math/r1_1.5b_gapo_stage2_16k", "math/r1_1.5b_gapo_stage3_24k"),
                note=NOT_REPORTED),
        ),
        notes=("The paper reports sequence-level GAPO above token level, AIME24 17.9 vs 14.6, 'in one setting'; "
               "our notes do not say which, so no cell holds those numbers.",
               "Group size (paper): 4 -> 8 helped; 16 more stable, not more accurate. Our notes give no numbers.",),
    ),
}


@dataclass
class Job:
    """One training run of a table row, resolved."""

    config: str
    overrides: list[str]
    checkpoint_dir: str
    after: str | None = None  # the run whose exported model this one starts from

    @property
    def command(self) -> list[str]:
        """The training command: ``python -m recipe.main_gapo --config-name CONFIG OVERRIDES...``."""
        return ["python", "-m", "recipe.main_gapo", "--config-name", self.config, *self.overrides]


def get_table(name: str) -> Table:
    """The table named ``name``; ReproduceError naming the valid ones otherwise."""
    if name not in TABLES:
        raise ReproduceError(f"unknown table {name!r}: choose one of {', '.join(TABLES)} "
                             f"(python -m recipe.reproduce {'|'.join(TABLES)})")
    return TABLES[name]


def cluster_overrides(nodes: int, gpus_per_node: int) -> list[str]:
    """Hydra overrides for the cluster's shape: trainer.nnodes and trainer.n_gpus_per_node."""
    return [f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={gpus_per_node}"]


def _compose(names_overrides: list[tuple[str, list[str]]]):
    """Compose each (config, overrides) with hydra, as `python -m recipe.main_gapo` would (a fresh copy each call:
    the same config and overrides are composed once per process, ~0.3 s each)."""
    return [copy.deepcopy(_composed(name, tuple(overrides))) for name, overrides in names_overrides]


@functools.cache
def _composed(name: str, overrides: tuple[str, ...]):
    """One hydra composition (cached by `_compose`, which hands out copies); ReproduceError naming the run."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        try:
            return compose(name, overrides=list(overrides))
        except HydraException as err:
            raise ReproduceError(f"{name} does not compose with {list(overrides)}: {err}") from err


def validate(cfg) -> None:
    """GAPO's and verl's start-up validation of a composed config (what the entry point runs first)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from gapo.verl_plugin.validate import validate_gapo_config

    validate_gapo_config(cfg)
    with contextlib.redirect_stdout(sys.stderr):  # verl prints its verdict: keep stdout to the commands
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)


def _missing_configs(table: Table) -> list[str]:
    return [run for row in table.rows for run in row.runs if not (CONFIG_DIR / f"{run}.yaml").is_file()]


def plan(table: Table, cluster: list[str], extra: list[str], ckpt_root: str | None = None,
         check: bool = True) -> list[tuple[Row, list[Job]]]:
    """Every row's training runs with their exact overrides, composed (and validated when `check`)."""
    from omegaconf import OmegaConf

    missing = _missing_configs(table)
    if missing:
        raise ReproduceError(f"table {table.name!r} lists configs that do not exist: {missing} (under {CONFIG_DIR})")
    out: list[tuple[Row, list[Job]]] = []
    for row in table.rows:
        jobs: list[Job] = []
        for run in row.runs:
            overrides = [*cluster, *row.overrides, *extra]
            cfg = _compose([(run, overrides)])[0]
            # two more plain-value overrides, set on the composed config as hydra would set them (no second compose)
            if ckpt_root:  # as launch/submit.sh's CKPT_ROOT, resolved: CKPT_ROOT/<project>/<experiment>
                local_dir = f"{ckpt_root.rstrip('/')}/{cfg.trainer.project_name}/{cfg.trainer.experiment_name}"
                overrides.append(f"trainer.default_local_dir={local_dir}")
                OmegaConf.update(cfg, "trainer.default_local_dir", local_dir)
            after = jobs[-1] if jobs else None
            if after is not None:  # starts from the previous stage's exported model
                model = f"{after.checkpoint_dir}/{MERGED_MODEL_DIR}"
                overrides.append(f"actor_rollout_ref.model.path={model}")
                OmegaConf.update(cfg, "actor_rollout_ref.model.path", model)
            if check:
                try:
                    validate(cfg)
                except Exception as err:  # noqa: BLE001  (any validation failure: name the run and stop)
                    raise ReproduceError(f"{run} with {overrides} does not pass start-up validation: {err}") from err
            jobs.append(Job(run, overrides, str(cfg.trainer.default_local_dir), after.config if after else None))
        out.append((row, jobs))
    return out


def merge_command(checkpoint_dir: str) -> str:
    """Shell command exporting a run's last checkpoint as an HF folder, the next stage's model."""
    latest = f"$(cat {shlex.quote(checkpoint_dir)}/latest_checkpointed_iteration.txt)"
    return (f"python -m verl.model_merger merge --backend fsdp --local_dir {shlex.quote(checkpoint_dir)}/global_step_"
            f"{latest}/actor --target_dir {shlex.quote(checkpoint_dir + '/' + MERGED_MODEL_DIR)}")


def eval_command(table: Table, row: Row, jobs: list[Job], eval_root: str) -> list[str]:
    """The ``python -m eval`` command of a row: its model (the last run's checkpoints, or the base model), the table's
    benchmarks and evaluation arguments, a flag of the row's own replacing the table's."""
    model = jobs[-1].checkpoint_dir if jobs else row.model
    own = {arg for arg in row.eval_args if arg.startswith("--")}
    shared, i = [], 0
    while i < len(table.eval_args):  # flag, value pairs
        if table.eval_args[i] not in own:
            shared += table.eval_args[i:i + 2]
        i += 2
    return ["python", "-m", "eval", "--model", model, "--bench", *table.benches,
            "--out", f"{eval_root}/{row.eval_name}", *shared, *row.eval_args]


def print_plan(table: Table, planned, eval_root: str, out=None) -> None:
    """Print each row's commands in order: training runs (each later stage after its predecessor's export), then the
    evaluation."""
    out = out or sys.stdout
    print(f"# table {table.name}: {table.title}", file=out)
    for row, jobs in planned:
        note = f"  ({row.note})" if row.note else ""
        print(f"\n## {row.label}{note}", file=out)
        if row.trained_in:
            print(f"# trained by `python -m recipe.reproduce {row.trained_in}`", file=out)
        for job in jobs:
            if job.after:
                prev = next(j for j in jobs if j.config == job.after)
                print(f"# after {job.after} finished: export its model", file=out)
                print(merge_command(prev.checkpoint_dir), file=out)
            print(shlex.join(job.command), file=out)
        print(shlex.join(eval_command(table, row, jobs, eval_root)), file=out)


def submit(table: Table, planned, script: Path, only: list[str] | None = None, out=None) -> list[list[str]]:
    """Submit the table's runs through `script` (launch/submit.sh --no-wait); returns the argument lists."""
    out = out or sys.stdout
    if not os.environ.get("RAY_ADDRESS"):
        raise ReproduceError("RAY_ADDRESS is not set: export RAY_ADDRESS=http://<head>:8265 (launch/README.md)")
    listed = {job.config for _, jobs in planned for job in jobs}
    unknown = sorted(set(only or ()) - listed)
    if unknown:
        raise ReproduceError(f"--only {unknown}: not a run of table {table.name!r}; its runs: {sorted(listed)}")
    calls = []
    for row, jobs in planned:
        for job in jobs:
            if only is not None and job.config not in only:
                continue
            if only is None and (row.trained_in or job.after):
                reason = (f"trained by table {row.trained_in}" if row.trained_in else
                          f"starts from {job.after}'s model: export it, then --only {job.config}")
                print(f"skipped {job.config}: {reason}", file=out)
                continue
            args = [str(script), "--no-wait", job.config, *job.overrides]
            print("+ " + shlex.join(args), file=out, flush=True)
            result = subprocess.run(args, check=False)
            if result.returncode != 0:
                raise ReproduceError(f"{script} failed for {job.config} (exit {result.returncode}); "
                                     f"submitted before it: {[c[2] for c in calls] or 'none'}")
            calls.append(args)
    return calls


def _cell(summary: dict | None, bench: str, k: int) -> float | None:
    if summary is None:
        return None
    value = summary.get("benchmarks", {}).get(bench, {}).get("pass@k", {}).get(str(k))
    return None if value is None else 100 * float(value)


def load_summaries(table: Table, eval_root: str, allow_missing: bool) -> dict[str, dict | None]:
    """{row eval name: summary.json content}; a missing file is an error unless `allow_missing`."""
    summaries, missing = {}, []
    for row in table.rows:
        path = Path(eval_root) / row.eval_name / "summary.json"
        if path.is_file():
            summaries[row.eval_name] = json.loads(path.read_text())
        else:
            summaries[row.eval_name] = None
            missing.append(str(path))
    if missing and not allow_missing:
        raise ReproduceError(f"no evaluation summary at {missing}: evaluate those runs first (the `python -m eval` "
                             f"commands of `python -m recipe.reproduce {table.name}`), point --eval-root at their "
                             "folder, or pass --allow-missing to leave their cells empty")
    return summaries


def fill_table(table: Table, summaries: dict[str, dict | None], allow_missing: bool = False) -> str:
    """Markdown: one row per paper row, one column per (benchmark, pass@k); each cell `ours (paper)`."""
    header = ["paper row", "run"] + [f"{BENCH_LABELS[b]} pass@{k}" for b, k in table.columns]
    lines = [f"# {table.title}", "", "cells: ours (paper), pass@k in %; - = not evaluated", "",
             "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in table.rows:
        summary = summaries.get(row.eval_name)
        cells = []
        for bench, k in table.columns:
            ours = _cell(summary, bench, k)
            if ours is None and summary is not None and not allow_missing:
                raise ReproduceError(f"{row.eval_name}/summary.json has no pass@{k} on {bench}: evaluate it with "
                                     f"--bench {bench} and --n >= {k}, or pass --allow-missing")
            text = "-" if ours is None else f"{ours:.1f}"
            paper = row.paper.get((bench, k))
            cells.append(text if paper is None else f"{text} ({paper:.1f})")
        label = row.label + (f" [{row.note}]" if row.note else "")
        run = row.eval_name if row.runs else row.model
        lines.append("| " + " | ".join([label, f"`{run}`", *cells]) + " |")
    lines += [""] + [f"- {note}" for note in table.notes]
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m recipe.reproduce`` (module docstring)."""
    p = argparse.ArgumentParser(prog="python -m recipe.reproduce", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("table", help=f"one of: {', '.join(TABLES)}")
    p.add_argument("overrides", nargs="*", help="hydra overrides for every run (key=value)")
    p.add_argument("--nodes", type=int, default=1, help="trainer.nnodes (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="trainer.n_gpus_per_node (default 8, the paper's)")
    p.add_argument("--ckpt-root", default=os.environ.get("CKPT_ROOT") or None,
                   help="checkpoints under CKPT_ROOT/<project>/<run> (default $CKPT_ROOT; else verl's checkpoints/)")
    p.add_argument("--eval-root", default=DEFAULT_EVAL_ROOT, help=f"evaluation folders (default {DEFAULT_EVAL_ROOT})")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--submit", action="store_true", help="submit the runs as Ray jobs through launch/submit.sh")
    mode.add_argument("--fill", action="store_true", help="print the table from EVAL_ROOT/<run>/summary.json")
    p.add_argument("--only", nargs="+", default=None, metavar="CONFIG", help="with --submit: only these runs")
    p.add_argument("--submit-script", type=Path, default=SUBMIT_SCRIPT, help="default launch/submit.sh")
    p.add_argument("--allow-missing", action="store_true", help="with --fill: empty cells for runs not evaluated")
    p.add_argument("--no-check", action="store_true", help="do not compose and validate every run first")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry: print the plan, submit it (``--submit``) or fill the table (``--fill``); returns 0 (2 on an error)."""
    args = parser().parse_intermixed_args(argv)
    try:
        table = get_table(args.table)
        if args.fill:
            summaries = load_summaries(table, args.eval_root, args.allow_missing)
            print(fill_table(table, summaries, args.allow_missing), end="")
            return 0
        bad = [o for o in args.overrides if "=" not in o]
        if bad:
            raise ReproduceError(f"{bad}: overrides are hydra key=value pairs, e.g. trainer.total_epochs=1")
        if args.submit and not (args.ckpt_root and args.ckpt_root.startswith("/")):
            raise ReproduceError(f"--submit needs --ckpt-root (or CKPT_ROOT) as an absolute path on storage every node "
                                 f"and every later job sees, got {args.ckpt_root!r}: each job's working dir is a "
                                 "fresh upload, and the evaluation reads the checkpoints from there")
        planned = plan(table, cluster_overrides(args.nodes, args.gpus_per_node), args.overrides, args.ckpt_root,
                       check=not args.no_check)
        if args.submit:
            submit(table, planned, args.submit_script, args.only)
        else:
            print_plan(table, planned, args.eval_root)
    except ReproduceError as err:
        print(f"reproduce: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
