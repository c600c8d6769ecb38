# Set-up is part of every target: `make run` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PORT   ?= 8501

.PHONY: run test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.runtime: requirements.txt | $(PY)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

run: $(VENV)/.runtime
	$(PY) -m streamlit run app.py --server.address 127.0.0.1 --server.port $(PORT) \
		$(if $(or $(WORKLOAD),$(METRICS_PORT)),--) $(if $(WORKLOAD),--workload $(WORKLOAD)) \
		$(if $(METRICS_PORT),--metrics-port $(METRICS_PORT))

# Two pytest workers: most of a test's time is a child process starting (python, torch); the
# timing-sensitive tests check the measured evidence, neighbours included. Browser tests
# share one worker (loadgroup: conftest.py). Three workers were slower on 2 cores (673 s
# against 642 s) and starved the browser tests.
TEST_WORKERS ?= 2

test: $(VENV)/.dev
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

lint: $(VENV)/.dev
	$(PY) -m ruff check .

bench: $(VENV)/.runtime
	$(PY) bench/presets.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
