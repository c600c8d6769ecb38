# Set-up is part of every target: `make run` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PORT   ?= 8501

.PHONY: run test lint bench clean

# pip byte-compiles every module it installs (~15,600 files with torch, transformers and
# sympy), two thirds of a fresh install's time, while ~2,000 of them are ever imported. So
# installs skip it, and modules are compiled when first imported: WARM (what the dashboard
# and the workload import) at install, whatever PYTHONDONTWRITEBYTECODE says, and the suite
# runs with bytecode writing on, so each module is compiled once, not in every process.
# constraints.txt pins this machine's torch for this venv only (see that file): the package's
# own dependencies leave an installed torch alone.
PIP  := $(PY) -m pip install -q --no-compile -c constraints.txt
WARM := torch torch.utils.data numpy pandas pyarrow streamlit streamlit.web.bootstrap \
	plotly.graph_objects plotly.io psutil pynvml prometheus_client rich.live tsdownsample

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.runtime: requirements.txt constraints.txt | $(PY)
	$(PIP) -r requirements.txt
	PYTHONDONTWRITEBYTECODE= $(PY) -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" $(WARM)
	touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	$(PIP) -r requirements-dev.txt
	$(PIP) --no-deps "fastai>=2.8"  # without torchvision: see requirements-dev.txt
	$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('torchvision') is not None \
		and 'torchvision is installed: it breaks Lightning on this torch; pip uninstall it')"
	touch $@

# A real MLflow tracking server for the --mlflow output's tests, in a venv of its own:
# MLflow's server pins its own pandas, numpy, pyarrow and Flask, and the package's client is
# not what the output uses (it speaks MLflow's REST API with the standard library).
MLFLOW_VENV := .venv-mlflow
$(MLFLOW_VENV)/.ready: | $(PY)
	$(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/python -m pip install -q --no-compile "mlflow>=2.16"
	touch $@

# PyPI's torch with its torchvision and Ultralytics, for tests/test_vision.py: PyPI's
# torchvision is built against PyPI's (CUDA) torch and fails to import beside .venv's CPU
# torch, so scripts that need it run in a venv of their own (5.9 GB; pip takes torch and
# torchvision from this machine's disk where they lie there). Pinned: the tests' figures are
# these releases'.
VISION_VENV := .venv-vision
$(VISION_VENV)/.ready:
	$(PYTHON) -m venv $(VISION_VENV)
	$(VISION_VENV)/bin/python -m pip install -q --no-compile torch==2.14.1 torchvision==0.29.1 \
		ultralytics==8.4.190
	PYTHONDONTWRITEBYTECODE= $(VISION_VENV)/bin/python -c "import torchvision, ultralytics.models.yolo"
	touch $@

# The same command a pip-installed user runs: Streamlit's settings (no usage statistics,
# loopback) come on its command line, not from this checkout's .streamlit/.
run: $(VENV)/.runtime
	$(PY) -m monitor dashboard --address 127.0.0.1 --port $(PORT) \
		$(if $(WORKLOAD),--workload $(WORKLOAD)) $(if $(METRICS_PORT),--metrics-port $(METRICS_PORT))

# Four pytest workers on 2 cores: the suite is CPU-bound (children starting: python,
# torch; an `import torch` is 1.6 s of CPU here, ~230 of them a suite) and its tests also
# wait (for a hang to be named, a page to show), so with three workers a quiet box sat 20%
# idle (910 CPU-s in 569 s); beside other busy processes more runnable workers take a larger
# share of the cores. Fresh clone, one core kept busy, back to back: 587 s with four, 682 s
# with three (earlier: 453 s with three against 495 with two). The timing-sensitive tests
# check the measured evidence, neighbours included. Browser tests share one worker
# (loadgroup: conftest.py); before they did, three workers were slower (673 s against
# 642 s) with two Chromiums side by side. With four the box's cores are busy ~1.9 of 2 from
# start to end, quiet, and no worker idles at the end: six took 697.7 s against 728.1 s
# (bench/suite_cpu.py, one run each, docs/benchmarks.md session 14): nothing to fill.
TEST_WORKERS ?= 4

test: $(VENV)/.dev $(MLFLOW_VENV)/.ready $(VISION_VENV)/.ready
	bash .ci/test-deps
	$(PY) -m ruff check .
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25

lint: $(VENV)/.dev
	$(PY) -m ruff check .

bench: $(VENV)/.runtime
	$(PY) bench/presets.py

clean:
	rm -rf $(VENV) $(MLFLOW_VENV) $(VISION_VENV) .pytest_cache .ruff_cache
