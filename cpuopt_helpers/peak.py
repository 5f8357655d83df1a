"""The theoretical peak of a CPU: FLOP a cycle a core per dtype, times its clock, times its cores.

The measured GEMM ceilings (notebook 00, ``roofline``) say what this machine reaches; the
theoretical peak says how far that is from what its cores could do. Every row of ``CORES``
names the microarchitecture it covers, by vendor, family and model as ``/proc/cpuinfo`` gives
them, and the source of its numbers. A CPU no row covers is "unknown", never guessed.

FLOP a cycle a core = FMA pipes x lanes x 2 (a fused multiply-add is two FLOPs):

| cores                                  | fp32 | bf16 | how                                                       |
|----------------------------------------|------|------|-----------------------------------------------------------|
| Intel Sapphire/Emerald/Granite Rapids  | 64   | 1024 | 2 AVX-512 FMA pipes x 16; AMX TMUL: 1024 bf16 FLOP/cycle  |
| Intel Cooper Lake                      | 64   | 128  | 2 AVX-512 FMA pipes x 16; AVX512-BF16 dot products: 2x    |
| Intel Ice Lake SP, Cascade/Skylake SP  | 64   | -    | 2 AVX-512 FMA pipes x 16 (Gold 6xxx, Platinum); no bf16   |
| AMD Zen 5                              | 64   | 128  | 512-bit datapath: 2 FMA pipes x 16; VDPBF16PS: 2x fp32    |
| AMD Zen 4                              | 32   | 64   | AVX-512 on 256-bit pipes: 2 x 8, half a Sapphire Rapids core's fp32 rate; VDPBF16PS: 2x |
| AMD Zen 2, Zen 3                       | 32   | -    | 2 AVX2 FMA pipes x 8; no bf16 arithmetic                  |

Sources: Intel 64 and IA-32 Architectures Optimization Reference Manual (AVX-512 FMA units,
AMX: 2048 int8 / 1024 bf16 operations a cycle a core); AMD Software Optimization Guides for
family 17h (Zen 2), 19h (Zen 3, Zen 4: "AVX-512 ... executed as two 256-bit operations") and
1Ah (Zen 5: full 512-bit datapath). "-": no bf16 arithmetic (bf16 converts to fp32; no faster
peak to state).

The clock: ``cpuinfo_max_freq`` from sysfs where the kernel shows it (the highest clock a core
reaches, so the peak is an upper bound). Where it does not, as in most VMs, the clock is
measured on this machine (``measured_clock_ghz``: a chain of dependent integer adds, one a
cycle, timed; the best of five), and said so; where no C compiler or no known instruction set
allows that, ``/proc/cpuinfo``'s ``cpu MHz`` (the clock the hypervisor reports), else unknown.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Core:
    name: str
    vendor: str
    family: int
    models: tuple[range, ...]
    flop_per_cycle: dict  # dtype -> FLOP a cycle a core (None: no arithmetic of that dtype)
    source: str


INTEL, AMD = "GenuineIntel", "AuthenticAMD"
INTEL_SOURCE = "Intel 64 and IA-32 Architectures Optimization Reference Manual"
CORES = (
    Core("Intel Sapphire Rapids", INTEL, 6, (range(143, 144),), {"fp32": 64, "bf16": 1024},
         f"{INTEL_SOURCE}: 2 AVX-512 FMA units; AMX TMUL 1024 bf16 FLOP/cycle"),
    Core("Intel Emerald Rapids", INTEL, 6, (range(207, 208),), {"fp32": 64, "bf16": 1024},
         f"{INTEL_SOURCE}: 2 AVX-512 FMA units; AMX TMUL 1024 bf16 FLOP/cycle"),
    Core("Intel Granite Rapids", INTEL, 6, (range(173, 175),), {"fp32": 64, "bf16": 1024},
         f"{INTEL_SOURCE}: 2 AVX-512 FMA units; AMX TMUL 1024 bf16 FLOP/cycle"),
    Core("Intel Ice Lake SP", INTEL, 6, (range(106, 107), range(108, 109)), {"fp32": 64, "bf16": None},
         f"{INTEL_SOURCE}: 2 AVX-512 FMA units; no bf16 arithmetic"),
    Core("Intel Skylake/Cascade/Cooper Lake SP", INTEL, 6, (range(85, 86),), {"fp32": 64, "bf16": None},
         f"{INTEL_SOURCE}: 2 AVX-512 FMA units (Gold 6xxx, Platinum; Cooper Lake's AVX512-BF16 is read from the flags)"),
    Core("AMD Zen 5", AMD, 26, (range(0, 256),), {"fp32": 64, "bf16": 128},
         "AMD Software Optimization Guide for family 1Ah: 512-bit datapath, 2 FMA pipes; VDPBF16PS"),
    Core("AMD Zen 4", AMD, 25, (range(16, 32), range(96, 128), range(160, 176)), {"fp32": 32, "bf16": 64},
         "AMD Software Optimization Guide for family 19h: AVX-512 as two 256-bit operations; VDPBF16PS"),
    Core("AMD Zen 3", AMD, 25, (range(0, 16), range(32, 96)), {"fp32": 32, "bf16": None},
         "AMD Software Optimization Guide for family 19h: 2 AVX2 FMA pipes; no bf16 arithmetic"),
    Core("AMD Zen 2", AMD, 23, (range(49, 50), range(96, 128), range(144, 160)), {"fp32": 32, "bf16": None},
         "AMD Software Optimization Guide for family 17h: 2 AVX2 FMA pipes; no bf16 arithmetic"),
)


def _field(cpuinfo: str, name: str) -> str | None:
    match = re.search(rf"^{name}\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return match.group(1).strip() if match else None


def identify(cpuinfo: str) -> tuple[Core | None, str]:
    """The table's row for this CPU (None where no row covers it), and how it was read."""
    vendor, family, model = _field(cpuinfo, "vendor_id"), _field(cpuinfo, "cpu family"), _field(cpuinfo, "model")
    if not (vendor and family and model and family.isdecimal() and model.isdecimal()):
        return None, "cpuinfo names no vendor, family and model"
    fam, mod = int(family), int(model)
    where = f"{vendor} family {fam} model {mod}"
    core = next((c for c in CORES if c.vendor == vendor and c.family == fam and any(mod in r for r in c.models)), None)
    return core, where


def per_cycle(core: Core | None, flags: set[str]) -> dict:
    """FLOP a cycle a core per dtype; a Skylake-SP row with AVX512-BF16 flags is a Cooper Lake."""
    if core is None:
        return {"fp32": None, "bf16": None}
    out = dict(core.flop_per_cycle)
    if core.name.startswith("Intel Skylake") and "avx512_bf16" in flags:
        out["bf16"] = 2 * out["fp32"]
    return out


# One register-to-register add a cycle on every x86-64 and Arm64 core: no immediate for the
# renamer to fold, each add waits for the one before. 20 an iteration; the loop's own counter and
# branch run beside them on the other ALUs.
ADDS = {"x86_64": "add %1, %0\\n\\t", "aarch64": "add %0, %0, %1\\n\\t"}
CLOCK_C = r"""
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(void) {
    unsigned long x = 1, y = 3, n = 10000000UL;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double start = now();
        for (unsigned long i = 0; i < n; i++) __asm__ volatile(CHAIN : "+r"(x) : "r"(y));
        double ghz = 20.0 * n / (now() - start) / 1e9;
        if (ghz > best) best = ghz;
    }
    printf("%.4f %lu\n", best, x & 1);
    return 0;
}
"""


@functools.lru_cache(maxsize=1)
def measured_clock_ghz() -> float | None:
    """This core's clock, measured: 20 dependent adds an iteration, 10 million iterations, the
    fastest of five repeats (under a second). None where no C compiler is found or the
    instruction set is not x86-64 or Arm64."""
    add = ADDS.get(platform.machine())
    cc = next(filter(None, map(shutil.which, ("cc", "gcc", "clang"))), None)
    if add is None or cc is None:
        return None
    with tempfile.TemporaryDirectory(prefix="cpuopt-clock-") as folder:
        source, exe = os.path.join(folder, "clock.c"), os.path.join(folder, "clock")
        Path(source).write_text(CLOCK_C.replace("CHAIN", '"' + add * 20 + '"'))
        try:
            subprocess.run([cc, "-O1", "-o", exe, source], check=True, capture_output=True, timeout=60)
            out = subprocess.run([exe], check=True, capture_output=True, text=True, timeout=60).stdout
            return float(out.split()[0])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None


def clock_ghz(cpuinfo: str, root: str = "/", measure=None) -> tuple[float | None, str]:
    """The clock the peak is taken at, and where it was read: sysfs's maximum, else ``measure()``
    (``measured_clock_ghz`` on this machine), else cpuinfo's ``cpu MHz``."""
    try:
        khz = int((Path(root) / "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text().strip())
        return khz / 1e6, "sysfs cpuinfo_max_freq (the highest clock a core reaches)"
    except (OSError, ValueError):
        pass
    ghz = measure() if measure else None
    if ghz:
        return ghz, "measured here: dependent adds, one a cycle, timed (the kernel shows no maximum clock, as in a VM)"
    why = " and it could not be measured here (no C compiler, or no adds for this instruction set)" if measure else ""
    mhz = _field(cpuinfo, "cpu MHz")
    try:
        reported = f"/proc/cpuinfo cpu MHz (the clock it reports; the kernel shows no maximum, as in a VM{why})"
        return float(mhz) / 1e3, reported
    except (TypeError, ValueError):
        return None, "unknown: neither sysfs nor /proc/cpuinfo gives a clock"


def theoretical(cpuinfo: str, cores: int, root: str = "/", clock: tuple[float, str] | None = None) -> dict:
    """The theoretical peak of ``cores`` cores: per dtype GFLOP/s (None where unknown), with what it
    rests on. ``clock``: (GHz, where it was read), as ``stored_clock`` gives it; else the clock is read
    now, and measured only for this machine (``root`` "/"), and only where sysfs shows none."""
    core, where = identify(cpuinfo)
    flags = set((_field(cpuinfo, "flags") or "").split())
    flop = per_cycle(core, flags)
    ghz, clock_from = clock or clock_ghz(cpuinfo, root, measured_clock_ghz if root == "/" else None)
    gflops = {dtype: (f * ghz * cores if f and ghz else None) for dtype, f in flop.items()}
    return {"cpu": where, "core": core.name if core else "unknown: not in cpuopt's table (peak.CORES)",
            "source": core.source if core else None, "flop_per_cycle_per_core": flop, "clock_ghz": ghz,
            "clock_source": clock_from, "cores": cores, "theoretical_gflops": gflops}


def stored_clock(roofline: dict | None) -> tuple[float, str] | None:
    """The clock read when these ceilings were measured (``roofline.measure``), so that every page
    and notebook of a run states one theoretical peak: a clock measured in a VM moves a few percent
    between readings. None where the ceilings carry no clock (measured by an older cpuopt)."""
    if not (roofline or {}).get("clock_ghz"):
        return None
    return roofline["clock_ghz"], f"{roofline['clock_source']}, with the GEMM ceilings"


def peak_report(cpuinfo: str, cores: int, roofline: dict | None, root: str = "/") -> dict:
    """`cpuopt doctor --json`'s ``peak``: per dtype the theoretical and the measured GFLOP/s (notebook
    00's GEMM ceiling, None where not measured yet), and the measured share of the theoretical; the
    theoretical at the clock read with the ceilings, where they carry one."""
    theory = theoretical(cpuinfo, cores, root, stored_clock(roofline))
    measured = {"fp32": (roofline or {}).get("gemm_gflops_best"), "bf16": (roofline or {}).get("gemm_gflops_bf16_best")}
    per_dtype = {d: {"theoretical_gflops": theory["theoretical_gflops"][d], "measured_gflops": measured[d],
                     "measured_share": (measured[d] / theory["theoretical_gflops"][d]
                                        if measured[d] and theory["theoretical_gflops"][d] else None)}
                 for d in ("fp32", "bf16")}
    for dtype, key in (("fp32", "gemm_paths"), ("bf16", "gemm_paths_bf16")):  # the sizes and paths it is the best of
        per_dtype[dtype]["measured_paths"] = (roofline or {}).get(key)
    return {**per_dtype, **{k: v for k, v in theory.items() if k != "theoretical_gflops"}}


def peak_lines(report: dict) -> list[str]:
    """The doctor's words for the peak, one line per dtype, then the clock and where it was read."""
    lines = []
    for dtype in ("fp32", "bf16"):
        p, f = report[dtype], report["flop_per_cycle_per_core"][dtype]
        theory = (f"{p['theoretical_gflops']:.0f} GFLOP/s theoretical ({f} FLOP/cycle/core x {report['clock_ghz']:.2f} "
                  f"GHz x {report['cores']} cores)" if p["theoretical_gflops"] else
                  "theoretical unknown" + (" (no clock)" if f else f" ({report['core']})" if not report["source"]
                                           else " (no arithmetic of this dtype)"))
        paths = f" (best of {', '.join(p['measured_paths'])})" if p.get("measured_paths") else ""
        measured = (f"; measured GEMM {p['measured_gflops']:.0f} GFLOP/s{paths}" if p["measured_gflops"] else
                    "; measured: not yet (notebook 00)")
        share = f" = {p['measured_share']:.0%} of it" if p["measured_share"] else ""
        lines.append(f"{'peak ' + dtype:<12} {theory}{measured}{share}")
    if report["clock_ghz"]:
        lines.append(f"{'clock':<12} {report['clock_ghz']:.2f} GHz: {report['clock_source']}")
    return lines
