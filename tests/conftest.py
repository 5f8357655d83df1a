"""Shared test factories: made-up machine facts, a machine read from an lscpu fixture, and this
machine's real facts (read once, when a test first asks; never at import)."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
LIBS = {"jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        "iomp": "/venv/lib/libiomp5.so"}


def make_facts(**changes):
    """The facts of a made-up 2-core, 1-socket machine with both allocators, Intel's OpenMP and a
    bf16 fast path; ``changes`` replace any of them (e.g. ``bf16={"accelerated": False, ...}``)."""
    facts = {"fingerprint": "m", "cpu_model": "made-up CPU", "cpu_vendor": "GenuineIntel",
             "physical_cores": 2, "logical_cores": 2, "sockets": 1, "numa_nodes": {"0": [0, 1]},
             "openmp": {"gnu": "bundled with torch (libgomp)", "intel": LIBS["iomp"]},
             "allocators": {"jemalloc": LIBS["jemalloc"], "tcmalloc": LIBS["tcmalloc"]},
             "bf16": {"accelerated": True, "path": "amx", "reason": "AMX"}}
    from cpuopt_helpers.system import Facts

    return Facts.from_dict({**facts, **changes})


def make_machine(fixture: str = "lscpu_p_xeon_2s_smt.txt", numactl: bool = True, taskset: bool = True,
                 libs: dict | None = None):
    """A planning.Machine whose topology is an `lscpu -p` fixture (default: a 2-socket Xeon with SMT)."""
    from cpuopt_helpers import planning, system

    topo = system.Topology(tuple(system.parse_lscpu_parse((FIXTURES / fixture).read_text())))
    return planning.Machine(topo, dict(LIBS if libs is None else libs), numactl, taskset)


@pytest.fixture
def facts():
    """A factory of made-up facts: ``facts(physical_cores=4)`` (see ``make_facts``)."""
    return make_facts


@pytest.fixture
def machine():
    """A factory of machines read from fixtures: ``machine("lscpu_p_epyc_2core.txt")`` (see ``make_machine``)."""
    return make_machine


@pytest.fixture(scope="session")
def this_facts():
    """This machine's facts (`cpuopt doctor`), read once per test session."""
    from cpuopt_helpers import system

    return system.collect_facts()
