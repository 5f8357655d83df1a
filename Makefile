# cpuopt workbook. Every target bootstraps what it needs; a second call is quick.
#   make run        execute the workbook (PRESET=standard by default) into build/; WORKLOADS=a,b
#                   (built-in names or your own package.module:function) for every notebook that takes them
#   make case-study notebook 08 with the whole ladder climbed on RetinaNet at 80 and 601 classes (CLASSES=80: one);
#                   the longest target: see docs/case-study.md;
#                   PRESET=full: RetinaNet at 800 px and 264 classes, defaults against the top, profiled and compared
#                   (CLASSES does not apply: docs/case-study.md gives the line for another class count)
#   make test       every test: unit, integration (real workers), notebooks (each once: 00 by nbval, 01-09 by
#                   papermill); the notebooks and the rest as two pytest processes side by side; its duration
#                   and outcome as a dated record under docs/results/
#   make test-fast  the tests that start no worker process and no notebook (-m "not slow"): the edit loop
#   make docs       the docs site (README, docs/, the results pages, the last report) into build/site/
#   make lab        JupyterLab on notebooks/ with the `cpuopt` kernel
#
# Where: VENV, by default .venv here (created with $(PYTHON)). To use an environment you already
# have, name it on the command line, e.g. in an activated conda env: make run VENV=$CONDA_PREFIX
# (make installs into it and registers the kernel there; it creates a venv only where VENV does
# not exist yet, and refuses a folder that holds no bin/python).
# What: the package with its extras [workbook,test] at the exact versions of CONSTRAINTS
# (constraints.txt; CONSTRAINTS= installs within pyproject.toml's ranges and keeps what the
# environment already has), torch from PyTorch's CPU index TORCH_INDEX as well (TORCH_INDEX= : only
# pip's own indexes, which on Linux give a CUDA build). After changing either: rm $(VENV)/.cpuopt-setup

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.cpuopt-setup
CONSTRAINTS ?= constraints.txt
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# torch's range as in pyproject.toml (tests/test_packaging.py keeps them equal)
TORCH_RANGE := torch>=2.4
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
PRESET ?= standard
CLASSES ?= 80, 601
IPEX_VENV := .venv-ipex
IPEX_STAMP := $(IPEX_VENV)/.cpuopt-setup
IPEX ?= 1
# make -n (--dry-run, --just-print): recipes that run anyway (those calling $(MAKE)) write no record
DRY_RUN = $(findstring n,$(firstword -$(MAKEFLAGS)))

.PHONY: setup system-deps ipex run case-study test test-notebooks test-others test-fast docs lab overhead parse-speed focal-loss detection-loss lamb clean

# The three parts are independent: a sub-make builds them side by side (the IPEX runtime's
# download overlaps the workbook venv's install).
setup:
	@$(MAKE) --no-print-directory -s -j3 $(STAMP) system-deps $(if $(filter 0,$(IPEX)),,ipex)

# The IPEX runtime: torch 2.8 + Intel Extension for PyTorch 2.8 in their own venv
# (IPEX is archived; its last release needs torch 2.8). IPEX=0 skips it.
ipex: $(IPEX_STAMP)

$(IPEX_STAMP): requirements-ipex.txt
	@test -x $(IPEX_VENV)/bin/python || $(PYTHON) -m venv $(IPEX_VENV)
	@free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); [ "$$free" -ge 8 ] || { \
	  echo "cpuopt: the IPEX runtime needs about 8 GB free here (its venv takes 6.8 GB); $$free GB are free: free some space, or rerun with IPEX=0 (make run IPEX=0) to skip it"; exit 1; }
	@echo "cpuopt: building the IPEX runtime $(IPEX_VENV) (about 4 GB of downloads; IPEX=0, as in make run IPEX=0, skips it)"
	$(IPEX_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-ipex.txt 2>&1 | grep -v "^WARNING: Location" || true
	@PYTHONPATH=. $(IPEX_VENV)/bin/python -m cpuopt_helpers.runtimes 2>/dev/null | grep -q '"ipex_usable": true' || { echo "cpuopt: the IPEX runtime does not import IPEX; see the pip output above"; exit 1; }
	@touch $(IPEX_STAMP)

# torch first and alone (--no-deps), from PyTorch's CPU index as well as pip's own: for the same
# version pip prefers the CPU build (2.13.0+cpu sorts above 2.13.0), and only torch is looked up
# there. Then the package and everything else from pip's own indexes; the torch just installed
# satisfies it. With the constraints both steps install exactly constraints.txt.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	@if [ ! -x $(PY) ]; then \
	  if [ "$(VENV)" != .venv ] && [ -e "$(VENV)" ]; then \
	    echo "cpuopt: VENV=$(VENV) has no bin/python; name a Python environment (a venv, a conda env) or a new folder"; exit 1; fi; \
	  if [ "$(VENV)" = .venv ] && [ -n "$${CONDA_PREFIX}$${VIRTUAL_ENV}" ]; then \
	    echo "cpuopt: creating .venv; to install into the active environment instead: make $(or $(MAKECMDGOALS),setup) VENV=$${VIRTUAL_ENV:-$$CONDA_PREFIX}"; fi; \
	  $(PYTHON) -m venv $(VENV); fi
	@# constraints.txt's pins (numpy 2.4, pandas 3.1) need Python 3.11: said before pip fails on them
	@if [ -n "$(CONSTRAINTS)" ] && ! $(PY) -c "import sys; sys.exit(sys.version_info < (3, 11))"; then \
	  echo "cpuopt: $(VENV) has Python $$($(PY) -c 'import platform; print(platform.python_version())'); the pinned versions of $(CONSTRAINTS) need 3.11 or newer: remove $(VENV) and make again with PYTHON=python3.11 (or newer), or CONSTRAINTS= to install within pyproject.toml's ranges"; exit 1; fi
	$(PIP_INSTALL) --no-deps $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "$(TORCH_RANGE)" 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP_INSTALL) -e '.[workbook,test]' 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -c "import cpuopt_helpers, torch, papermill, nbval" || { echo "cpuopt: installing the environment failed; see the pip output above"; exit 1; }
	@# AMD's torch.compile backend on an AMD CPU only (validated on EPYC; Intel's counterpart, IPEX, has its own
	@# runtime): the zentorch release built for this torch; where it does not install, notebook 05 says why
	@v=$$($(PY) -c "import torch; print('.'.join(torch.__version__.split('+')[0].split('.')[:3]))"); \
	if [ -n "$$v" ] && grep -q AuthenticAMD /proc/cpuinfo 2>/dev/null; then \
	  echo "cpuopt: AMD CPU: installing zentorch $$v.* (AMD's torch.compile backend, measured in notebook 05)"; \
	  $(PIP_INSTALL) "zentorch==$$v.*" 2>&1 | grep -v "^WARNING: Location" || true; fi
	@$(PY) -c "import sys, torch; sys.exit(torch.version.cuda is not None)" || echo "cpuopt: note: $$($(PY) -c 'import torch; print(torch.__version__)') is a CUDA build of torch; the workbook needs only the CPU build: see TORCH_INDEX in the Makefile"
	$(PY) -m ipykernel install --sys-prefix --name cpuopt --display-name "Python (cpuopt)" >/dev/null
	@touch $(STAMP)

system-deps:
	@bash scripts/system-deps.sh

# then the answer: README.md's generated block and this run's dated page under docs/results/
run: setup
	IPEX=$(IPEX) $(VENV)/bin/cpuopt workbook run --preset $(PRESET) $(if $(WORKLOADS),--workloads '$(WORKLOADS)')
	$(VENV)/bin/cpuopt workbook readme --preset $(PRESET) --write README.md --page docs/results

# The full case study (notebook 08 with the whole ladder climbed on RetinaNet at 80 and 601 classes,
# each rung confirmed by the adaptive rule in 5 to 14 paired rounds (a rung decided at 5 stops there; an
# undecided one goes on, so gains of 5-8% can be confirmed), the top against PyTorch's defaults in 10,
# and conv + frozen BN + ReLU as compiled regions), into build/ beside `make
# run`'s results (`cpuopt ladder --workload retinanet` reads it).
# PRESET=full: RetinaNet at 800 px with 264 classes (MLPerf's subset), PyTorch's defaults against the
# standard ladder's top in 5 fixed paired rounds, the top under an allocator that keeps freed memory where the
# kernel takes much of its time and the trial fits within BUDGET_MIN (60 minutes by default), each arm profiled
# by phase (cpuopt_helpers.fullstudy); its page, with how long it took: docs/results/DAY-CPU-ISA-retinanet-full.md
case-study: setup
ifeq ($(PRESET),full)
	$(PY) -m cpuopt_helpers.fullstudy --page docs/results $(if $(ROUNDS),--rounds $(ROUNDS)) $(if $(BUDGET_MIN),--budget-min $(BUDGET_MIN))
else
	$(if $(strip $(CLASSES)),,$(error CLASSES is empty: name the class counts to climb, e.g. CLASSES=80))
	IPEX=$(IPEX) $(VENV)/bin/cpuopt workbook run --preset $(PRESET) --only 08 -p CLIMB_CLASSES '[$(CLASSES)]' \
	  -p MIN_ROUNDS 5 -p MAX_ROUNDS 14 -p FINAL_ROUNDS 10 -p BUDGET_MIN 10 -p COMPILED_REGION True -p DISCREPANCY True
endif

# It times itself, from its first line (TEST_START: make expands the whole recipe before running it)
# to the tests' end, writes the duration and outcome as this machine's dated record
# docs/results/DAY-CPU-ISA-make-test.md (not under make -n), and exits with the tests' status.
# -k: both halves run to their end even when one fails at once (without it, make started no
# second half once the first had failed, which a loaded machine can make happen).
test: TEST_START = $(shell date +%s)
test: setup
	@bash scripts/system-deps.sh chromium
	@echo "cpuopt: the notebook tests and the other tests run side by side (two pytest processes); each prints its report when it ends"
	@status=0; $(MAKE) --no-print-directory -s -j2 -k -Otarget test-notebooks test-others || status=$$?; \
	$(if $(DRY_RUN),,$(PY) -m cpuopt_helpers.records make-test --seconds $$(( $$(date +%s) - $(TEST_START) )) \
	  --status $$status --folder docs/results || echo "cpuopt: make test's record was not written";) exit $$status

# The two halves of `make test` (which sets up first). The notebooks (00 through nbval first, its NBVAL_CHECK_OUTPUT
# compared with the committed output; then 01-09 through papermill; then the workbook killed and
# resumed, tests/test_faults.py, and the full study's smoke test, tests/test_fullstudy.py, which
# keeps the other half's tail short) are one sequence of worker
# processes, the longer half; the other tests are independent of it, so they run beside it at
# the lowest priority, on what CPU time the notebooks leave (their numbers are not findings: no
# test asserts a timing beyond generous ratios and timeouts). Lowest under Linux's autogroup
# scheduling too, which shares the CPUs between sessions first: scripts/low-priority.sh runs the
# half in a session of its own at nice 19, and each worker it starts (in a session of its own)
# gets nice 19 from the launcher (launch.keep_niceness). With nice -n 19 alone, a worker of each
# half shared the cores and both trained many times slower.
test-notebooks:
	IPEX=$(IPEX) $(PY) -m pytest notebooks/00_system_check.ipynb tests/test_notebooks.py tests/test_faults.py \
	  tests/test_fullstudy.py --nbval-lax -p no:cacheprovider -q -rs --durations=5

test-others:
	IPEX=$(IPEX) bash scripts/low-priority.sh $(PY) -m pytest tests --ignore=tests/test_notebooks.py \
	  --ignore=tests/test_faults.py --ignore=tests/test_fullstudy.py -p no:cacheprovider -q -rs --durations=10

# The edit loop: unit tests and pure functions, no worker processes, no notebooks.
test-fast: setup
	IPEX=$(IPEX) $(PY) -m pytest -m "not slow" tests -p no:cacheprovider -q -rs

# The docs site: README.md as its home, docs/*.md, the dated results pages (docs/results/) and the
# last run's report with its executed notebooks, offline, warnings as errors, into build/site/.
docs: setup
	$(PY) -m cpuopt_helpers.power --write docs/measuring.md
	$(VENV)/bin/mkdocs build --strict --quiet -f "$$($(PY) -m cpuopt_helpers.site)"
	@echo "cpuopt: the site: build/site/index.html"

lab: setup
	$(VENV)/bin/jupyter lab notebooks $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# prints JSON and writes this machine's dated page docs/results/DAY-CPU-ISA-overhead.md
overhead: setup
	$(PY) benchmarks/overhead.py --page docs/results

# VERBOSE_CONVERTER=DIR (oneDNN's scripts/verbose_converter) times its breakdown against ours, named by
# the commit DIR's git gives; prints JSON and writes the dated page docs/results/DAY-CPU-ISA-parse-speed.md
parse-speed: setup
	$(PY) benchmarks/parse_speed.py --page docs/results $(if $(VERBOSE_CONVERTER),--verbose-converter '$(VERBOSE_CONVERTER)')

focal-loss: setup
	$(PY) -m cpuopt_helpers.kernels.benchmark focal

detection-loss: setup
	$(PY) -m cpuopt_helpers.kernels.benchmark loss

lamb: setup
	$(PY) -m cpuopt_helpers.kernels.benchmark lamb

clean:
	rm -rf build
