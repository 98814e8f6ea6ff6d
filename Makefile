# Every target sets up its own virtual environment from nothing on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test bench lint system-deps clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Pinned: the CPU wheel on disk. An unpinned torch pulls gigabytes of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[torch,demo,ft,dev]'
	# The oldest pynvml the agent allows, beside the venv: a test runs the agent's NVML backend on it.
	$(PY) -m pip install -q --upgrade --target $(VENV)/pynvml-oldest nvidia-ml-py==12.535.161
	touch $(STAMP)

# The combined default drill; each run gets its own report directory under demo-out/.
demo: venv
	$(PY) -m sentinel demo --out demo-out/$$(date +%Y%m%d-%H%M%S)

# System packages first (installed as root, otherwise the command is printed and the tests that
# need them fail naming it), then the lint gate, then every test: those marked slow (drills that
# time real work on every core, and tests holding a bound in seconds) one at a time, the others,
# multi-process end-to-end runs among them, in two workers beside each other, where they mostly
# wait on subprocesses. Both halves always run; the target fails if either did.
test: venv system-deps lint
	$(PY) -m pytest -q -m "not slow" -n 2 --durations=10; quick=$$?; \
	$(PY) -m pytest -q -m slow --durations=25; slow=$$?; \
	exit $$((quick | slow))

system-deps:
	scripts/install-system-deps.sh

# Every benchmark in turn, with a live progress display on a terminal (benchmarks/__main__.py).
bench: venv
	$(PY) -m benchmarks

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy sentinel

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
