"""Lamb on RetinaNet's trainable parameters: per-parameter loop vs multi-tensor (foreach),
and IPEX's fused Lamb in the IPEX runtime.

Run with `make lamb` (or `python benchmarks/lamb.py [--preset standard] [--json]`). Each
process times its kernels interleaved, round by round; IPEX's fused Lamb runs in the
IPEX runtime (torch 2.8) in a second process, beside that runtime's own loop, so each
speedup is a ratio measured inside one process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch


def parameters(preset: str) -> list[torch.nn.Parameter]:
    """RetinaNet's trainable parameters (torchvision's default: 3 backbone stages), with gradients."""
    from cpuopt_helpers.workloads.retinanet import RetinaNet

    model = RetinaNet(preset, 80, 3, "separate")
    params = [p for p in model.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    return params


def make(kind: str, params):
    if kind == "ipex fused":
        import intel_extension_for_pytorch as ipex

        opt = ipex.optim._lamb.Lamb(params, lr=1e-3)
        model = torch.nn.ParameterList(params)
        _, opt = ipex.optimize(model, optimizer=opt, dtype=torch.float32, weights_prepack=False, inplace=True)
        return opt
    from cpuopt_helpers.kernels.lamb import Lamb

    return Lamb(params, lr=1e-3, impl=kind)


def measure(kinds: list[str], preset: str, rounds: int) -> dict:
    from cpuopt_helpers import stats

    optimizers = {k: make(k, parameters(preset)) for k in kinds}
    for opt in optimizers.values():  # warm up: state allocation outside the clock
        opt.step()
    times = {k: [] for k in kinds}
    for _ in range(rounds):
        for k, opt in optimizers.items():
            start = time.perf_counter()
            opt.step()
            times[k].append(time.perf_counter() - start)
    base = kinds[0]
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "preset": preset,
           "tensors": len(optimizers[base].param_groups[0]["params"]),
           "elements": sum(p.numel() for p in optimizers[base].param_groups[0]["params"]), "kernels": {}}
    for k in kinds:
        ratio = stats.interleaved_ratio(times[k], times[base])  # base time / this kernel's time
        out["kernels"][k] = {"median_ms": stats.summarize([t * 1e3 for t in times[k]])["median"],
                             "speedup_vs_loop": ratio["median"], "ci": [ratio["ci_low"], ratio["ci_high"]]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="standard", help="RetinaNet preset whose parameters are updated")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--ipex-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.ipex_only:
        print(json.dumps(measure(["loop", "ipex fused"], args.preset, args.rounds)))
        return 0
    results = [measure(["loop", "foreach"], args.preset, args.rounds)]
    from cpuopt_helpers import runtimes

    status = runtimes.ipex_status()
    if status["available"]:
        env = dict(os.environ, PYTHONPATH=str(runtimes.PROJECT_ROOT))
        proc = subprocess.run([status["python"], __file__, "--ipex-only", "--preset", args.preset,
                               "--rounds", str(args.rounds)], capture_output=True, text=True, env=env, timeout=900)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else
                       {"error": proc.stderr.strip()[-500:]})
    else:
        results.append({"skipped": status["reason"]})
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for r in results:
        if "kernels" not in r:
            print(f"IPEX runtime: {r.get('skipped') or r.get('error')}")
            continue
        print(f"torch {r['torch']}, {r['threads']} threads, RetinaNet[{r['preset']}]: {r['tensors']} tensors, "
              f"{r['elements']:,} parameters")
        for k, v in r["kernels"].items():
            print(f"  {k:<12} {v['median_ms']:8.2f} ms/step  {v['speedup_vs_loop']:5.2f}x the loop "
                  f"(95% CI {v['ci'][0]:.2f}-{v['ci'][1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
