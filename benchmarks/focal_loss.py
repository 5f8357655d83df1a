"""The focal loss: torchvision's composite formula against the closed-form kernels.

Run with `make focal-loss` (or `python benchmarks/focal_loss.py [--json]`). At RetinaNet's
logit shapes (anchors x classes for the quick and standard presets, 80 COCO-like and 601
OpenImages-like classes) it times forward, backward and both for the reference, the eager
closed-form kernel and the compiled one, interleaved round by round in this one process,
and prints each kernel's median time and its speedup over the reference with a 95% CI.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from cpuopt_helpers import stats
from cpuopt_helpers.kernels.focal_loss import reference_sigmoid_focal_loss, sigmoid_focal_loss

# preset -> (image size, images per batch): RetinaNet's anchors are 9 per cell of P3-P7
# (strides 8-128); the workload's presets use these sizes
PRESETS = {"quick": (64, 4), "standard": (256, 2)}


def anchors(size: int) -> int:
    return 9 * sum(-(-size // 2**level)**2 for level in range(3, 8))


def shapes() -> dict:
    return {f"{p} {c} classes": (anchors(size) * batch, c) for p, (size, batch) in PRESETS.items() for c in (80, 601)}


def time_kernel(fn, x, t, part: str) -> float:
    """Seconds of one forward, one backward or both (the loss summed, as a detector does)."""
    x = x.detach().clone().requires_grad_()
    start = time.perf_counter()
    loss = fn(x, t, reduction="sum")
    mid = time.perf_counter()
    loss.backward()
    end = time.perf_counter()
    return {"forward": mid - start, "backward": end - mid, "both": end - start}[part]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    kernels = {"reference": reference_sigmoid_focal_loss,
               "closed-form eager": lambda x, t, **kw: sigmoid_focal_loss(x, t, impl="eager", **kw),
               "closed-form compiled": lambda x, t, **kw: sigmoid_focal_loss(x, t, impl="compiled", **kw)}
    rows = []
    for name, shape in shapes().items():
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(shape, generator=g) * 3).to(dtype)
        t = (torch.rand(shape, generator=g) < 0.01).to(dtype)  # detection: few positive anchors
        for fn in kernels.values():  # warm up (and compile) outside the clock
            for _ in range(2):
                time_kernel(fn, x, t, "both")
        for part in ("forward", "backward", "both"):
            times = {k: [] for k in kernels}
            for _ in range(args.rounds):
                for k, fn in kernels.items():
                    times[k].append(time_kernel(fn, x, t, part))
            for k in kernels:
                ratio = stats.interleaved_ratio(times[k], times["reference"])  # reference time / kernel time
                rows.append({"shape": name, "elements": shape[0] * shape[1], "part": part, "kernel": k,
                             "median_ms": stats.summarize([s * 1e3 for s in times[k]])["median"],
                             "speedup": ratio["median"], "speedup_low": ratio["ci_low"],
                             "speedup_high": ratio["ci_high"]})
    if args.json:
        json.dump({"dtype": args.dtype, "threads": torch.get_num_threads(), "rows": rows}, sys.stdout, indent=1)
        print()
        return 0
    print(f"focal loss, {args.dtype}, {torch.get_num_threads()} threads, {args.rounds} interleaved rounds")
    for r in rows:
        print(f"{r['shape']:<22} {r['part']:<8} {r['kernel']:<21} {r['median_ms']:9.3f} ms  "
              f"{r['speedup']:5.2f}x the reference (95% CI {r['speedup_low']:.2f}-{r['speedup_high']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
