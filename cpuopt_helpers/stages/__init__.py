"""The steps of the method, in order: one module per stage, one notebook per stage.

Every stage that hands a rung on follows one protocol, for one workload at a time (a test
holds each to it):

- ``configs(base, facts, ...) -> decisions.Plan``: what to measure, its arms named, the first
  the base every ratio is taken against, and what is left out on this machine and why;
- ``table(results, plan)``: the tidy data its notebook shows, each arm against the base;
- ``choose(table, plan, confirm, ...) -> decisions.Choice``: the choice through compare.py (a
  configuration or None, never a label), confirmed in fresh rounds (``confirm``);
- ``findings(table, ...)``: what it found, as ``decisions.Finding`` records, worded by
  ``cpuopt_helpers.wording`` (a notebook prints and keeps them with ``Session.tell``).

A notebook ends with ``Session.settle(stage, table, plan, ...)``, which calls the stage's
``choose`` with its confirmation rounds, stores the finding and hands the choice on.
``profiling`` and ``summary`` hand nothing on; ``choosing`` holds what several stages share
(the table of settings against a base, the choice through compare.py); ``climb`` is notebook
08's whole ladder, its rungs as data.

A new step of the method (say 10, quantization) is a module here, a row in STAGES, a
notebook ``10_quantization.ipynb`` and a test.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from cpuopt_helpers.errors import CpuoptError


@dataclass(frozen=True)
class Stage:
    name: str  # the module under cpuopt_helpers/stages/
    notebook: str  # its notebook's number
    rung: str | None  # the ladder rung it hands on (None: it measures, hands nothing on)
    question: str
    tag: str  # what its notebook's runs are stored under (the notebook's file name)

    @property
    def module(self) -> ModuleType:
        return importlib.import_module(f"cpuopt_helpers.stages.{self.name}")


STAGES = (
    Stage("baseline", "01", "baseline", "How fast does each workload train with PyTorch's defaults?", "01_baseline"),
    Stage("profiling", "02", None, "Where does the step's time go, and how fast could its kernels run?", "02_profiling"),
    Stage("threads", "03", "threading", "Which threads, affinity and OpenMP settings pay?", "03_threading"),
    Stage("allocator", "04", "allocator", "Does jemalloc or tcmalloc pay, at what memory cost?", "04_allocator"),
    Stage("extensions", "05", "runtime", "IPEX, torch.compile, channels-last or fused optimizers?", "05_ipex"),
    Stage("precision", "06", "bf16", "Does bf16 autocast pay here, and does training still converge?", "06_bf16"),
    Stage("multi_instance", "07", "multi-instance", "How many ranks of how many threads?", "07_multi_instance"),
    Stage("case_study", "08", "case-study fixes", "Which of the paper's RetinaNet fixes pay?", "08_case_study"),
    Stage("summary", "09", None, "From PyTorch's defaults to the last rung: how much, and what does it save?",
          "09_summary"),
)


# the ladder's rungs in the order of the method (rungs are stored under these names)
LADDER_STAGES = tuple(s.rung for s in STAGES if s.rung)


def stage(name: str) -> Stage:
    """A stage by its module name, rung or notebook number."""
    for s in STAGES:
        if name in (s.name, s.rung, s.notebook):
            return s
    raise CpuoptError(f"unknown stage {name!r}; use one of {', '.join(s.name for s in STAGES)}")


def stage_index(stage: str) -> int:
    """Where a stage's rungs sit in the ladder; a name from an older store goes last, in arrival order."""
    return LADDER_STAGES.index(stage) if stage in LADDER_STAGES else len(LADDER_STAGES)
