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

.PHONY: setup system-deps run test lab overhead parse-speed clean

setup: $(STAMP) system-deps

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e . 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -c "import cpuopt_helpers, torch, papermill, nbval" || { echo "cpuopt: installing the environment failed; see the pip output above"; exit 1; }
	$(PY) -m ipykernel install --sys-prefix --name cpuopt --display-name "Python (cpuopt)" >/dev/null
	@touch $(STAMP)

system-deps:
	@bash scripts/system-deps.sh

run: setup
	$(VENV)/bin/cpuopt workbook run --preset $(PRESET)

test: setup
	$(PY) -m pytest tests notebooks --nbval-lax -p no:cacheprovider -q -rs

lab: setup
	$(VENV)/bin/jupyter lab notebooks $$([ "$$(id -u)" = 0 ] && echo --allow-root)

overhead: setup
	$(PY) benchmarks/overhead.py

parse-speed: setup
	$(PY) benchmarks/parse_speed.py

clean:
	rm -rf build
