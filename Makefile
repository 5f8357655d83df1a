# cpuopt workbook. Every target bootstraps what it needs; a second call is quick.
#   make run    execute the workbook (PRESET=standard by default) into build/
#   make test   every test: unit, integration (real workers), notebooks (papermill + nbval)
#   make lab    JupyterLab on notebooks/ with the `cpuopt` kernel

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.cpuopt-setup
PRESET ?= standard
IPEX_VENV := .venv-ipex
IPEX_STAMP := $(IPEX_VENV)/.cpuopt-setup
IPEX ?= 1

.PHONY: setup system-deps ipex run test lab overhead parse-speed focal-loss lamb clean

setup: $(STAMP) system-deps $(if $(filter 0,$(IPEX)),,ipex)

# The IPEX runtime: torch 2.8 + Intel Extension for PyTorch 2.8 in their own venv
# (IPEX is archived; its last release needs torch 2.8). IPEX=0 skips it.
ipex: $(IPEX_STAMP)

$(IPEX_STAMP): requirements-ipex.txt
	@test -x $(IPEX_VENV)/bin/python || $(PYTHON) -m venv $(IPEX_VENV)
	@echo "cpuopt: building the IPEX runtime $(IPEX_VENV) (about 4 GB of downloads; IPEX=0 skips it)"
	$(IPEX_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-ipex.txt 2>&1 | grep -v "^WARNING: Location" || true
	@PYTHONPATH=. $(IPEX_VENV)/bin/python -m cpuopt_helpers.runtimes 2>/dev/null | grep -q '"ipex_usable": true' || { echo "cpuopt: the IPEX runtime does not import IPEX; see the pip output above"; exit 1; }
	@touch $(IPEX_STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e . 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -c "import cpuopt_helpers, torch, papermill, nbval" || { echo "cpuopt: installing the environment failed; see the pip output above"; exit 1; }
	$(PY) -m ipykernel install --sys-prefix --name cpuopt --display-name "Python (cpuopt)" >/dev/null
	@touch $(STAMP)

system-deps:
	@bash scripts/system-deps.sh

run: setup
	IPEX=$(IPEX) $(VENV)/bin/cpuopt workbook run --preset $(PRESET)

test: setup
	@bash scripts/system-deps.sh chromium
	IPEX=$(IPEX) $(PY) -m pytest tests notebooks --nbval-lax -p no:cacheprovider -q -rs

lab: setup
	$(VENV)/bin/jupyter lab notebooks $$([ "$$(id -u)" = 0 ] && echo --allow-root)

overhead: setup
	$(PY) benchmarks/overhead.py

parse-speed: setup
	$(PY) benchmarks/parse_speed.py

focal-loss: setup
	$(PY) -m cpuopt_helpers.kernels.benchmark focal

lamb: setup
	$(PY) -m cpuopt_helpers.kernels.benchmark lamb

clean:
	rm -rf build
