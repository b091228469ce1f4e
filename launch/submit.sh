#!/usr/bin/env bash
# Submit a GAPO experiment as a Ray job to the cluster at RAY_ADDRESS and follow its logs.
#
#   RAY_ADDRESS=http://HEAD:8265 launch/submit.sh [--no-wait] <experiment> [hydra overrides...]
#   e.g.  launch/submit.sh math/r1_1.5b_gapo trainer.nnodes=4 trainer.n_gpus_per_node=8
#
# The job runs `python3 -m recipe.main_gapo --config-name <experiment> [overrides...]` on the head node, in an
# upload of this repository (working_dir, with the excludes of launch/runtime_env.yaml). The nodes need this
# project installed (`pip install -e '.[gpu]'`, in the image or the venv that started Ray): the working dir
# brings the code, but verl finds the GAPO plug-in through the installed package's `verl.plugins` entry point.
# Exit status: 0 when the job succeeded; 1 when it failed or was stopped; with --no-wait, 0 once submitted.
#
# Settings (environment):
#   RAY_ADDRESS      required: the Ray dashboard / job server, http://HEAD:8265
#   FOLLOW=0         same as --no-wait: print the job id and return
#   CKPT_ROOT        shared folder for checkpoints; sets trainer.default_local_dir=CKPT_ROOT/<project>/<experiment>
#                    (resume across jobs needs an absolute path every node and every later job sees)
#   EXTRA_ENV        more env vars for the job, shell-quoted NAME=VALUE pairs, e.g.
#                    EXTRA_ENV="VERL_PLATFORM=cpu VERL_ENGINE_DEVICE=cuda NCCL_SOCKET_IFNAME='eth0'"
#   PASSTHROUGH_ENV  variables of this shell passed on to the job when set (default below)
#   JOB_ID           submission id (default gapo-<experiment>-<date>-<random>)
#   RUNTIME_ENV      base runtime env file (default launch/runtime_env.yaml)
#   WORKING_DIR      folder uploaded as the job's working dir (default: this repository)
#   CONFIG_DIR       experiment configs (default: configs/ of this repository)
#   JOB_PYTHON       python on the cluster that runs the entry point (default python3)
#   PYTHON           local python with ray and PyYAML (default python3); RAY: local ray CLI (default ray)
set -euo pipefail

LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=${GAPO_ROOT:-$(dirname "$LAUNCH_DIR")}
CONFIG_DIR=${CONFIG_DIR:-$ROOT/configs}
RUNTIME_ENV=${RUNTIME_ENV:-$LAUNCH_DIR/runtime_env.yaml}
WORKING_DIR=${WORKING_DIR:-$ROOT}
PYTHON=${PYTHON:-python3}
RAY=${RAY:-ray}
JOB_PYTHON=${JOB_PYTHON:-python3}
FOLLOW=${FOLLOW:-1}
CKPT_ROOT=${CKPT_ROOT:-}
EXTRA_ENV=${EXTRA_ENV:-}
PASSTHROUGH_ENV=${PASSTHROUGH_ENV:-WANDB_MODE WANDB_ENTITY WANDB_PROJECT WANDB_DIR WANDB_BASE_URL \
GAPO_DATA_DIR GAPO_SMOKE_DIR GAPO_STAGE_INIT_MODEL HF_HOME HF_HUB_OFFLINE HF_DATASETS_OFFLINE HF_ENDPOINT \
VERL_FILE_LOGGER_PATH GAPO_SKIP_PREFLIGHT GAPO_DEBUG_LOSS_ROWS}
JOB_ID=${JOB_ID:-}

die() { echo "submit.sh: error: $*" >&2; exit 2; }

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --no-wait) FOLLOW=0; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) break ;;
    esac
done
[[ $# -ge 1 ]] || { usage >&2; exit 2; }
experiment=${1%.yaml}
shift

# What an experiment is (a yaml file under CONFIG_DIR with a top-level hydra: key), and the message for an unknown one
# (the closest names and the list), are python -m recipe.main_gapo's own: gapo/config_names.py, standard library only.
if ! unknown=$(PYTHONPATH="$LAUNCH_DIR/..${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m gapo.config_names experiment \
        "$CONFIG_DIR" "$experiment"); then
    die "${unknown:-could not check the experiment name with $PYTHON (PYTHON: a python 3)}"
fi
[[ -n ${RAY_ADDRESS:-} ]] || die "RAY_ADDRESS is not set: export RAY_ADDRESS=http://<head>:8265 (the Ray dashboard \
of a running cluster; launch/slurm_ray.sbatch starts one on Slurm)"

runtime_env_json=$("$PYTHON" "$LAUNCH_DIR/ray_job.py" runtime-env --base "$RUNTIME_ENV" \
    --passthrough "$PASSTHROUGH_ENV" --extra "$EXTRA_ENV") || die "could not build the runtime env"

# A job's driver connects to the running cluster, whose resources were fixed by `ray start`: Ray refuses
# ray.init(num_cpus=..., num_gpus=...) there, which presets for a local Ray (smoke_cpu) set.
overrides=("++ray_kwargs.ray_init.num_cpus=null" "++ray_kwargs.ray_init.num_gpus=null")
if [[ -n $CKPT_ROOT ]]; then
    [[ $CKPT_ROOT == /* ]] || die "CKPT_ROOT must be an absolute path on storage the nodes share, got '$CKPT_ROOT'"
    # shellcheck disable=SC2016  # hydra interpolations, resolved by the job
    overrides+=("trainer.default_local_dir=$CKPT_ROOT/\${trainer.project_name}/\${trainer.experiment_name}")
fi
overrides+=("$@")   # the user's overrides come last and win

if [[ -z $JOB_ID ]]; then
    JOB_ID="gapo-${experiment//[^A-Za-z0-9_.-]/-}-$(date +%Y%m%d-%H%M%S)-$RANDOM"
fi

"$RAY" job submit --address "$RAY_ADDRESS" --submission-id "$JOB_ID" --no-wait \
    --working-dir "$WORKING_DIR" --runtime-env-json "$runtime_env_json" \
    -- "$JOB_PYTHON" -m recipe.main_gapo --config-name "$experiment" "${overrides[@]}" >&2
echo "submitted job: $JOB_ID"

if [[ $FOLLOW == 0 ]]; then
    echo "logs:   $RAY job logs --address $RAY_ADDRESS --follow $JOB_ID"
    echo "status: $RAY job status --address $RAY_ADDRESS $JOB_ID"
    echo "stop:   $RAY job stop --address $RAY_ADDRESS $JOB_ID"
    exit 0
fi

trap 'echo; echo "submit.sh: stopped following; job $JOB_ID keeps running (stop it: $RAY job stop $JOB_ID)" >&2; exit 130' INT
"$RAY" job logs --address "$RAY_ADDRESS" --follow "$JOB_ID" || true
trap - INT
status=$("$PYTHON" "$LAUNCH_DIR/ray_job.py" status --address "$RAY_ADDRESS" "$JOB_ID")
while [[ $status == PENDING || $status == RUNNING ]]; do   # the log stream ended early (e.g. a dropped connection)
    sleep 10
    status=$("$PYTHON" "$LAUNCH_DIR/ray_job.py" status --address "$RAY_ADDRESS" "$JOB_ID")
done
echo "job $JOB_ID: $status"
[[ $status == SUCCEEDED ]]
