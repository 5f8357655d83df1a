"""This machine's measured ceilings: fp32 and bf16 GEMM GFLOP/s and memory-copy GB/s; and the
rate of writing fresh memory (each page faulted in) against memory already mapped.

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
# seconds the bf16 GEMM may take where the CPU has no bf16 instructions (see measure_bf16_gemm)
BF16_BUDGET_S = 15.0


def measure_bf16_gemm(size: int, repeats: int, budget_s: float = BF16_BUDGET_S) -> dict:
    """The bf16 GEMM rate (torch.mm on bf16 tensors), median and best over repeats.

    Same square size as the fp32 GEMM where the machine runs bf16 natively (AMX,
    AVX512-BF16); a CPU without bf16 instructions emulates it, often 10-50x slower than fp32,
    so the size is halved (down to 256) until warm-up and repeats fit in ``budget_s`` by a
    small probe's rate; ``gemm_size_bf16`` says what ran. The ceiling (``gemm_gflops_bf16_best``)
    is the best of that and, where they fit in the budget too, the other paths a step's bf16 GEMMs
    take (``gemm_paths``: half the size, a 1x1 convolution in channels-last, the layout oneDNN's
    bf16 kernels prefer), as fp32's is: one path at one moment can read low. None values when
    bf16 GEMM fails.
    """
    import time

    import torch

    try:
        n = min(size, 256)
        x = torch.randn(n, n).bfloat16()
        torch.mm(x, x)
        start = time.perf_counter()
        torch.mm(x, x)
        rate = 2 * n**3 / max(time.perf_counter() - start, 1e-9)  # FLOP/s at the probe's size
        n = size
        while n > 256 and 2 * n**3 * (repeats + 1) / rate > budget_s:
            n //= 2
        a, b = torch.randn(n, n).bfloat16(), torch.randn(n, n).bfloat16()
        out = torch.empty(n, n, dtype=torch.bfloat16)
        gemm = time_calls(lambda: torch.mm(a, b, out=out), repeats)
        flops = 2 * n**3
        # the paths cost about 2.2 times the GEMM just timed (half the size: 1/8; the same size twice)
        paths = gemm_paths(n, repeats, torch.bfloat16) if 2.2 * (repeats + 1) * max(gemm) <= budget_s else None
    except RuntimeError:
        return {"gemm_gflops_bf16": None, "gemm_gflops_bf16_best": None, "gemm_size_bf16": None,
                "gemm_paths_bf16": None}
    return {"gemm_gflops_bf16": flops / statistics.median(gemm) / 1e9,
            "gemm_gflops_bf16_best": max([flops / min(gemm) / 1e9, *(paths or {}).values()]), "gemm_size_bf16": n,
            "gemm_paths_bf16": paths}


def ceiling_gflops(roofline: dict | None, dtype: str) -> float | None:
    """The GEMM ceiling (best GFLOP/s) for the dtype a run used, "fp32" or "bf16"; None where
    the roofline did not measure it (e.g. one stored before bf16 was measured)."""
    keys = {"fp32": "gemm_gflops_best", "bf16": "gemm_gflops_bf16_best"}
    if dtype not in keys:
        from cpuopt_helpers.errors import CpuoptError

        raise CpuoptError(f"no GEMM ceiling for dtype {dtype!r}; use one of {', '.join(keys)}")
    value = (roofline or {}).get(keys[dtype])
    return float(value) if value else None


def gemm_paths(size: int, repeats: int, dtype=None) -> dict[str, float]:
    """The best GFLOP/s (fp32 unless ``dtype``) of each way a training step reaches a GEMM:
    ``torch.mm`` (MKL or oneDNN's BLAS) at the preset's size and at half of it, and a 1x1
    convolution of the same work (oneDNN's convolution kernels, the path of a CNN's GEMMs; in
    channels-last for bf16). The ceiling is the best of them."""
    import torch
    import torch.nn.functional as F

    dtype = dtype or torch.float32
    out = {}
    for n in (size // 2, size):
        a, b, c = (torch.randn(n, n).to(dtype) for _ in range(3))
        out[f"mm {n}"] = 2 * n**3 / min(time_calls(lambda: torch.mm(a, b, out=c), repeats)) / 1e9
    # [size x size] @ [size x size] as a 1x1 convolution
    x, w = torch.randn(1, size, size, 1).to(dtype), torch.randn(size, size, 1, 1).to(dtype)
    layout = "channels-last " if dtype == torch.bfloat16 else ""
    if layout:
        x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
    out[f"conv1x1 {layout}{size}"] = 2 * size**3 / min(time_calls(lambda: F.conv2d(x, w), repeats)) / 1e9
    return out


def measure_here(size: int, copy_bytes: int, repeats: int) -> dict:
    """Run inside the measured process: GEMM and copy rates, median over repeats; the GEMM ceiling
    (``gemm_gflops_best``) the best over sizes and paths (``gemm_paths``)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    gemm = time_calls(lambda: torch.mm(a, b, out=out), repeats)
    src = torch.ones(copy_bytes // 4)
    dst = torch.empty_like(src)
    copy = time_calls(lambda: dst.copy_(src), repeats)
    write = time_calls(lambda: dst.fill_(1.0), repeats)
    # a new block each call: the C library's malloc maps a block this large afresh and unmaps it when
    # freed, so every page faults in on first touch (what a step pays whose allocator hands memory back)
    fresh = time_calls(lambda: torch.empty(copy_bytes // 4).fill_(1.0), repeats)
    flops = 2 * size**3
    paths = gemm_paths(size, repeats)
    bf16 = measure_bf16_gemm(size, repeats)
    return {
        "gemm_gflops": flops / statistics.median(gemm) / 1e9,
        "gemm_gflops_best": max(flops / min(gemm) / 1e9, *paths.values()),
        "gemm_paths": paths,
        **bf16,
        "copy_gbs": 2 * copy_bytes / statistics.median(copy) / 1e9,  # read + write
        "copy_gbs_best": 2 * copy_bytes / min(copy) / 1e9,
        "write_gbs": copy_bytes / statistics.median(write) / 1e9,  # into memory already mapped
        "fresh_write_gbs": copy_bytes / statistics.median(fresh) / 1e9,  # into memory mapped at first touch
        "gemm_size": size, "copy_mb": copy_bytes >> 20, "repeats": repeats,
        "threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0)),
    }


def measure(preset: str = "quick", threads: int | None = None, timeout_s: float = 300) -> dict:
    """Measure the ceilings in a fresh process pinned to the first `threads` cores, with the clock
    the theoretical peak is taken at (``clock_ghz``, ``clock_source``: ``peak.stored_clock``)."""
    from cpuopt_helpers import peak, system
    from cpuopt_helpers.errors import CpuoptError
    from cpuopt_helpers.runtimes import run_json_module

    if preset not in PRESETS:
        raise CpuoptError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
    topo = system.topology()
    threads = threads or topo.physical_cores
    cores = sorted(topo.core_order()[:threads])
    value = run_json_module("cpuopt_helpers.roofline", ["--preset", preset], "roofline measurement", threads=threads,
                            cores=cores, timeout_s=timeout_s)
    ghz, source = peak.clock_ghz(system.read_cpuinfo(), "/", peak.measured_clock_ghz)
    return {**value, "clock_ghz": ghz, "clock_source": source}


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
