"""The next fix, tried: one convolution of the step, alone, under each path this CPU offers.

A whole-step profile names the operator with the most time above its ceiling, and for GEMM-like
work it can only name the kinds of fix ("a faster kernel path"). Where that operator is a
convolution, this tries them: the one convolution, at the shapes the trace recorded, forward and
backward (the gradients of its input and weight, as training runs it), timed alone under each path,
interleaved round by round in one process, each against the path the step ran
(``compare.paired_ratio``: every speedup with its interval and verdict):

- ``as run``: the step's dtype, in the layout the step ran (``--layout``: NCHW, the default, or
  channels-last, which the trace's strides show where ``torch.compile`` chose it or the run asked for it);
- ``channels-last`` (or ``NCHW`` where the step ran channels-last): the same kernels in the other layout;
- ``GEMM form``: the convolution as matrix multiplies (ungrouped convolutions only), the path of a
  framework without a convolution kernel: a 1x1 convolution is one matrix multiply over its (strided)
  input in the step's layout; any other is im2col (``F.unfold``, whose columns are NCHW's whatever
  the input's layout) and one multiply an image; autograd takes the backward;
- ``bf16``, and bf16 in the other layout (``--dtype bf16``), only where the step ran fp32 and the
  bf16 gate found a fast path (elsewhere bf16 runs emulated kernels, many times slower).

Each path's rate alone (GFLOP/s) also tells a slow kernel from one the step slows (its caches,
other work, the tracer): a path as fast alone as the GEMM ceiling leaves nothing to a kernel fix.
The bias is left out (its gradient is a sum, no GEMM). Run it as the full study does, or alone::

    python -m cpuopt_helpers.kernels.conv_paths "2x2376x100x100; 2x256x100x100; 2376x256x3x3" [--rounds 8] \\
        [--layout channels-last]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from cpuopt_helpers import compare, stats
from cpuopt_helpers.flops import conv_flops

ROUNDS = compare.FIXED_ROUNDS  # interleaved rounds, one look
MIN_MEASURE_S = 0.2  # a small convolution is called this long a measurement (the mean of its calls)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LAYOUTS = ("NCHW", "channels-last")


@dataclass(frozen=True)
class Conv:
    """One 2-D convolution: input [n, c, h, w], weight [k, c / groups, kh, kw], output [n, k, ho, wo]."""

    input: tuple[int, int, int, int]
    weight: tuple[int, int, int, int]
    output: tuple[int, int, int, int]
    stride: int
    padding: int
    groups: int

    @property
    def gflop(self) -> float:
        """Forward GFLOP (a multiply and an add a weight element an input element it meets: the taps on
        padding are not work, as in ``flops.conv_flops``, with the padding ``from_shapes`` inferred: the same
        on both axes, and at a stride of 3 or more the likeliest of those that fit); the backward is twice."""
        return conv_flops(list(self.input), list(self.weight), list(self.output), False, [self.stride] * 2,
                          [self.padding] * 2, [1, 1]) / 1e9


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.strip().split("x"))


def from_shapes(shapes: str) -> Conv:
    """A convolution's backward from a trace's shapes, ``grad_output; input; weight``; stride and padding
    (dilation 1) are the smallest that map the input onto the output. A ValueError says what does not fit."""
    parts = [p for p in shapes.split(";") if p.strip()]
    if len(parts) < 3:
        raise ValueError(f"a convolution's backward records grad_output; input; weight, got {shapes!r}")
    out, x, w = (_dims(p) for p in parts[:3])
    if not (len(out) == len(x) == len(w) == 4) or w[1] < 1 or x[1] % w[1] or out[:2] != (x[0], w[0]):
        raise ValueError(f"not the shapes of a 2-D convolution's backward: {shapes!r}")
    kh, kw = w[2], w[3]
    for stride in range(1, 5):
        for padding in sorted(range(max(kh, kw)), key=lambda p: abs(p - (kh - 1) // 2)):
            if all((size + 2 * padding - k) // stride + 1 == o for size, k, o in zip(x[2:], (kh, kw), out[2:])):
                return Conv(x, w, out, stride, padding, x[1] // w[1])
    raise ValueError(f"no stride (1-4) and padding map input {x} onto output {out} with kernel {kh}x{kw}")


def paths(conv: Conv, dtype: str, bf16_fast: bool, layout: str = "NCHW") -> dict[str, tuple[str, bool, str]]:
    """Path -> (dtype, channels-last, form) this convolution can take here; ``as run`` (the step's
    dtype and layout) first, then the other layout, the GEMM form and bf16 in both layouts."""
    ran_cl = layout == "channels-last"
    other = LAYOUTS[0] if ran_cl else LAYOUTS[1]
    out = {"as run": (dtype, ran_cl, "kernel"), other: (dtype, not ran_cl, "kernel")}
    if conv.groups == 1:
        out["GEMM form"] = (dtype, ran_cl, "gemm")
    if dtype == "fp32" and bf16_fast:
        out |= {"bf16": ("bf16", ran_cl, "kernel"), f"bf16 {other}": ("bf16", not ran_cl, "kernel")}
    return out


def gemm_form(x: torch.Tensor, w: torch.Tensor, conv: Conv) -> torch.Tensor:
    """The convolution as matrix multiplies (autograd takes its backward): a 1x1 convolution one
    multiply over the strided input in its layout (channels-last: one [n*h*w, c] by [c, k], the output
    channels-last too), any other im2col and a multiply an image (NCHW columns and output)."""
    n, k, ho, wo = conv.output
    if w.shape[-2:] == (1, 1) and conv.padding == 0:
        c, s = x.shape[1], conv.stride
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():  # before the stride's slice
            rows = x.permute(0, 2, 3, 1)[:, ::s, ::s].reshape(-1, c)  # [n*ho*wo, c]: a view where the stride is 1
            return (rows @ w.reshape(k, c).t()).view(n, ho, wo, k).permute(0, 3, 1, 2)  # channels-last out
        return (w.reshape(k, c) @ x[:, :, ::s, ::s].reshape(n, c, ho * wo)).view(n, k, ho, wo)
    cols = F.unfold(x, w.shape[-2:], padding=conv.padding, stride=conv.stride)  # [n, c*kh*kw, ho*wo]
    return (w.reshape(k, -1) @ cols).view(n, k, ho, wo)


def tensors(conv: Conv, dtype: str, channels_last: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    make = lambda shape, scale=1.0: (torch.randn(shape, generator=g) * scale).to(DTYPES[dtype]).contiguous(  # noqa: E731
        memory_format=fmt)
    return {"x": make(conv.input).requires_grad_(), "w": make(conv.weight, 0.01).requires_grad_(),
            "grad": make(conv.output)}


def time_once(conv: Conv, form: str, t: dict[str, torch.Tensor], calls: int = 1) -> tuple[float, float]:
    """Seconds of one forward and one backward (input and weight gradients), each the mean of ``calls``."""
    forward = backward = 0.0
    for _ in range(calls):
        t["x"].grad = t["w"].grad = None
        start = time.perf_counter()
        y = (gemm_form(t["x"], t["w"], conv) if form == "gemm" else
             F.conv2d(t["x"], t["w"], stride=conv.stride, padding=conv.padding, groups=conv.groups))
        mid = time.perf_counter()
        y.backward(t["grad"])
        forward, backward = forward + mid - start, backward + time.perf_counter() - mid
    return forward / calls, backward / calls


def trial(conv: Conv, dtype: str = "fp32", bf16_fast: bool = False, rounds: int = ROUNDS, say=None,
          min_measure_s: float = MIN_MEASURE_S, layout: str = "NCHW") -> dict:
    """Each path's forward, backward and both against ``as run``, paired by round; rates alone."""
    chosen = paths(conv, dtype, bf16_fast, layout)
    data = {name: tensors(conv, d, cl) for name, (d, cl, _) in chosen.items()}
    for name, (_, _, form) in chosen.items():  # warm up outside the clock (oneDNN builds its primitives)
        time_once(conv, form, data[name])
    calls = max(1, math.ceil(min_measure_s / sum(time_once(conv, "kernel", data["as run"]))))
    times = {name: [] for name in chosen}
    for r in range(rounds):
        order = list(chosen) if r % 2 == 0 else list(reversed(chosen))  # neither end always first
        for name in order:
            times[name].append(time_once(conv, chosen[name][2], data[name], calls))
        if say:
            say(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {sum(times[n][-1]):.2f} s" for n in chosen))
    rows, gflop = [], {"forward": conv.gflop, "backward": 2 * conv.gflop, "both": 3 * conv.gflop}
    for name in chosen:
        for part, pick in (("forward", lambda s: s[0]), ("backward", lambda s: s[1]), ("both", sum)):
            mine, ref = [pick(s) for s in times[name]], [pick(s) for s in times["as run"]]
            ratio = compare.paired_ratio(mine, ref)  # the time as run / this path's, paired by round
            median = stats.summarize(mine)["median"]
            against = name != "as run"
            rows.append({"path": name, "part": part, "median_ms": median * 1e3, "gflops": gflop[part] / median,
                         "speedup": ratio["ratio"] if against else None,
                         "speedup_low": ratio["ci_low"] if against else None,
                         "speedup_high": ratio["ci_high"] if against else None,
                         "verdict": ratio["verdict"] if against else "", "rounds": ratio["n"]})
    return {"conv": asdict(conv), "dtype": dtype, "layout": layout, "threads": torch.get_num_threads(),
            "rounds": rounds, "calls": calls, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cpuopt_helpers.kernels.conv_paths",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("shapes", help="grad_output; input; weight, as a trace records them: '2x256x50x50; 2x256x50x50; "
                                   "256x256x3x3'")
    ap.add_argument("--dtype", default="fp32", choices=tuple(DTYPES), help="the dtype the step ran (default fp32)")
    ap.add_argument("--layout", default="NCHW", choices=LAYOUTS,
                    help="the layout the step ran the convolution in (default NCHW; a trace's strides tell)")
    ap.add_argument("--bf16-fast", action="store_true", help="also try bf16 (where the bf16 gate found a fast path)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds (default {ROUNDS}; 5 or more)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    try:
        conv = from_shapes(args.shapes)
    except ValueError as exc:
        print(f"cpuopt: {exc}", file=sys.stderr)
        return 2
    if args.rounds < 5:
        print(f"cpuopt: --rounds must be 5 or more for a verdict, got {args.rounds}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    result = trial(conv, args.dtype, args.bf16_fast, args.rounds,
                   say=None if args.json else lambda s: print(s, file=sys.stderr, flush=True), layout=args.layout)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{conv}: as run in {args.dtype}, {args.layout}; {result['rounds']} interleaved rounds, "
          f"{result['threads']} threads")
    for r in result["rows"]:
        against = "" if r["speedup"] is None else (f"  {r['speedup']:.2f}x (95% CI {r['speedup_low']:.2f}-"
                                                   f"{r['speedup_high']:.2f}): {r['verdict']}")
        print(f"{r['path']:20s} {r['part']:9s} {r['median_ms']:9.1f} ms {r['gflops']:7.1f} GFLOP/s{against}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
