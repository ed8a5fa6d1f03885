# Set-up and the main verbs. Needs only python3 (3.10+) and the package registry.
#
# The torch pin below is for CPU machines: it takes the CPU build of torch. On a GPU machine,
# install your CUDA or ROCm torch into the venv first (or run `make setup TORCH=`): the
# package itself only asks for a range, so an installed torch is kept.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
OUT ?= out

.PHONY: setup run test test-slow lint format gpu-check gpu-check-rehearsal test-triton36 clean \
	inspect-check inspect-baseline bench-trace

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@if [ -n "$(TORCH)" ] && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "installing $(TORCH)"; $(BIN)/python -m pip install -q "$(TORCH)"; fi
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

run: setup  ## the kernel report card
	$(BIN)/kernelab run

# Two tiers: `make test` skips the tests marked slow (end-to-end model runs, whole-op interpreter
# sweeps, Ray and Pallas interpreter runs); `make test-slow` runs only those. CI runs both.
test: setup lint inspect-check  ## lint, the inspect gate, then the test suite less its slow tier
	$(BIN)/python -m pytest -n 2 -q -m "not slow"

test-slow: setup  ## the slow tier alone (CI runs it before make test)
	@# pytest exits 5 when it collects no test: no test is marked slow, a failure here
	$(BIN)/python -m pytest -n 2 -q -m slow

# The gate compiles only the kernels whose cache key (kernel source and helpers, launch, target,
# compiler) differs from their baseline entry's; FULL=1 compiles every one.
FULL ?=
inspect-check: setup  ## compile every changed kernel for the GPUs, lower each changed Pallas call for the TPUs; fail on regressions
	$(BIN)/kernelab inspect --check --dtype bfloat16 $(if $(FULL),--full)

inspect-baseline: setup  ## rewrite inspect-baseline.json from the kernels as they are now (FULL=1: compile all)
	$(BIN)/kernelab inspect --update-baseline --dtype bfloat16 $(if $(FULL),--full)

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: setup
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

HTA_PYTHON ?= /tmp/hta/bin/python
bench-trace: setup  ## kernelab trace vs HTA (python3 -m venv /tmp/hta && /tmp/hta/bin/pip install holistictraceanalysis)
	$(BIN)/python benchmarks/bench_trace.py --hta-python $(HTA_PYTHON)

# On a CUDA machine, offline, with what is installed (no set-up step): ceilings, verify, bench of
# every op and the HTML report into $(OUT). GPU_PYTHON: the interpreter that has CUDA torch.
# WHEELS: a folder of wheels to install first, for packages the machine lacks (offline).
GPU_PYTHON ?= python3
WHEELS ?=
gpu-check:  ## ceilings, verify, bench and report on the GPU into $(OUT) (under 8 min on an H200)
	PYTHONUNBUFFERED=1 PYTHONPATH=src $(GPU_PYTHON) benchmarks/gpu_check.py --out $(OUT) \
		$(if $(WHEELS),--wheels $(WHEELS))

# The same steps through the same harness and the same offline wheel install, on this CPU with
# small budgets (torch variants only); exits non-zero if a step failed. CI runs it.
gpu-check-rehearsal: setup  ## the GPU check's steps on the CPU into $(OUT)/gpu-check-rehearsal
	PYTHONUNBUFFERED=1 PYTHONPATH=src $(BIN)/python benchmarks/gpu_check.py --rehearse \
		--out $(OUT)/gpu-check-rehearsal

# The GPU image's Triton (3.6) beside the CPU torch: a second virtual environment, in which the
# interpreter fixes (tests/core/runtime) and one op family (tests/ops/norm) must pass. CI runs it.
T36_VENV ?= build/venv-triton36
T36_PINS ?= triton==3.6.0 torch==2.13.0
T36_TESTS ?= tests/core/runtime tests/ops/norm
$(T36_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(T36_VENV)
	$(T36_VENV)/bin/python -m pip install -q $(T36_PINS)
	$(T36_VENV)/bin/python -m pip install -q -e . pytest pytest-xdist $(T36_PINS)
	touch $@

test-triton36: $(T36_VENV)/.installed  ## the interpreter and norm tests under triton 3.6
	$(T36_VENV)/bin/python -c "import torch, triton; print('triton', triton.__version__, \
		'torch', torch.__version__); assert triton.__version__ == '3.6.0', triton.__version__"
	@# pytest exits 5 when it collects no test: here that means the tests moved, a failure
	@$(T36_VENV)/bin/python -m pytest -n 2 -q $(T36_TESTS); rc=$$?; \
		if [ $$rc = 5 ]; then echo "test-triton36: no tests collected in $(T36_TESTS)"; fi; \
		exit $$rc

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info src/*.egg-info

.PHONY: verify
verify: setup  ## every op's variants against the float64 reference (docs/verify.md)
	$(BIN)/kernelab verify
