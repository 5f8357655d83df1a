"""This machine's measured ceilings: fp32 GEMM GFLOP/s and memory-copy GB/s.

Measured in a fresh pinned process (``python -m cpuopt_helpers.roofline``), like every
other measurement; later notebooks read the result from the store as the roofline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from cpuopt_helpers.stats import time_calls

# preset -> (square GEMM size, bytes copied per repeat, repeats)
PRESETS = {"quick": (1024, 64 << 20, 5), "standard": (2048, 256 << 20, 7), "full": (4096, 1 << 30, 7)}


def measure_here(size: int, copy_bytes: int, repeats: int) -> dict:
    """Run inside the measured process: GEMM and copy rates, median over repeats."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    gemm = time_calls(lambda: torch.mm(a, b, out=out), repeats)
    src = torch.ones(copy_bytes // 4)
    dst = torch.empty_like(src)
    copy = time_calls(lambda: dst.copy_(src), repeats)
    flops = 2 * size**3
    return {
        "gemm_gflops": flops / statistics.median(gemm) / 1e9,
        "gemm_gflops_best": flops / min(gemm) / 1e9,
        "copy_gbs": 2 * copy_bytes / statistics.median(copy) / 1e9,  # read + write
        "copy_gbs_best": 2 * copy_bytes / min(copy) / 1e9,
        "gemm_size": size, "copy_mb": copy_bytes >> 20, "repeats": repeats,
        "threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0)),
    }


def measure(preset: str = "quick", threads: int | None = None, timeout_s: float = 300) -> dict:
    """Measure the ceilings in a fresh process pinned to the first `threads` cores."""
    from cpuopt_helpers import system
    from cpuopt_helpers.errors import CpuoptError
    from cpuopt_helpers.launch import run_json_module

    if preset not in PRESETS:
        raise CpuoptError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
    topo = system.topology()
    threads = threads or topo.physical_cores
    cores = sorted(topo.core_order()[:threads])
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               CPUOPT_CORES=",".join(map(str, cores)))
    return run_json_module("cpuopt_helpers.roofline", ["--preset", preset], env, timeout_s, "roofline measurement")


def main(argv: list[str] | None = None) -> int:
    from cpuopt_helpers.worker import pin_to_cores

    parser = argparse.ArgumentParser(description="measure GEMM and copy ceilings in this process")
    parser.add_argument("--preset", default="quick", choices=sorted(PRESETS))
    args = parser.parse_args(argv)
    pin_to_cores()
    print(json.dumps(measure_here(*PRESETS[args.preset])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
