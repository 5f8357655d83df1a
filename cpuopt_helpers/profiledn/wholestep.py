"""Whole-step projection: every operator of a traced training step, its work, its ceiling and the gap.

The paper's projection reads oneDNN's log alone, and most of a PyTorch step never reaches oneDNN
(linear layers run through MKL, element-wise ops and the optimizer through ATen). This module
reads the torch.profiler trace that ``cpuopt bench --trace FILE`` records (input shapes and
dtypes of every operator) and gives every operator of the timed steps its measured time, its
work and the ceiling that applies, the roofline of notebook 00 (``roofline.measure``):

| rows                 | **top-level operator spans** of the step's thread: ``aten::conv2d``, ``autograd::engine::evaluate_function: XBackward0``, the optimizer's ``aten::add_`` ... A span nested in another is never a row of its own: its time is inside its parent's, so nothing is counted twice. A compiled region (``torch.compile``: Dynamo's frame, AOTAutograd's forward or backward) is the exception: its rows are the calls its generated code makes (``aten::convolution``, ``aten::convolution_backward``, ...) and one ``compiled code`` row, the rest of its time (Inductor's own kernels, which the profiler does not see: work unknown) |
| FLOPs                | at the outermost GEMM-like operator of a row's subtree (``convolution``, ``convolution_backward``, ``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``mkldnn_rnn_layer`` (+ backward), CPU flash attention (+ backward)), with the formulas of ``cpuopt_helpers.flops`` (2 FLOPs a multiply-accumulate; a convolution's taps on padding are not work, as benchdnn counts); nothing else counts FLOPs |
| bytes moved          | a GEMM-like op: its tensor inputs + its outputs (shapes from the formula). Any other op: its tensor inputs + an output as large as its largest input (in-place ops: ``self`` written back; fills, copies and random fills: written once; reductions: the output left out); views, allocations and metadata ops: 0. An op with children takes the larger of its own estimate and its children's sum (``aten::dropout`` is its ``bernoulli_``, ``div_`` and ``mul``), never both. Ops with tensor lists (shapes not recorded) are unknown |
| ceiling              | GEMM-like: ``max(FLOPs / GEMM GFLOP/s of the dtype that ran, bytes / copy GB/s)`` (fp32 or bf16 ceiling); others: ``bytes / copy GB/s``. Copy GB/s counts read + write, as bytes do |
| projection           | the step if each row ran at its ceiling (a row measured faster than its ceiling, e.g. data that fits in cache beating the DRAM copy rate, keeps its measured time) and time between ops vanished; rows whose work is unknown keep their measured time |
| gap, split by cause  | ``compute`` (rows whose ceiling is the GEMM rate, below peak), ``memory`` (rows bound by bandwidth, below it), ``no work`` (views, allocations, scalar bookkeeping: pure overhead), ``unknown`` (work not counted), ``between ops`` (the step's wall time outside every top-level span: Python, the autograd engine between nodes, the loop) |
| times                | from a second, light trace of the same steps recorded without shapes (``timing_path``, written by ``capture``): recording shapes slows every call, so the light trace runs closer to the unprofiled step (still above it: the profiler records every call). Its top-level spans are joined to the shaped trace's one by one (same operators in the same order, else the shaped trace's own times are kept, with a warning) |
| between ops by phase | each stretch of the step outside every top-level span goes to the phase (forward, loss, backward, optimizer) of the operator it leads to: where the framework's own time is spent |
| coverage             | share of the operators' time (the step less the time between ops) in rows whose work is known and has a ceiling; the time between ops is reported beside it and does not count either way (``step_coverage``: the same time over the whole step, between ops included) |

Rows are per call; ``operator_table`` groups them by operator, phase and input shapes per step.
The step times still run with the profiler on; the unprofiled step (``plain_step_ms``), when
given, is reported beside them, not mixed into shares.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cpuopt_helpers.decisions import Finding
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.flops import attention_flops, conv_flops, rnn_layer_flops
from cpuopt_helpers.profiledn.breakdown import STAGE
from cpuopt_helpers.profiledn.parse import conv_taps, parse_conv, parse_dims
from cpuopt_helpers.profiledn.trace import COMPILED_PREFIXES, load_events

log = logging.getLogger(__name__)

# torch.profiler's "Input type" strings -> bytes per element (anything else is not a tensor)
ELEMENT_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}
UNKNOWN_TENSORS = {"TensorList", "GenericList"}  # shapes not recorded: the op's bytes are unknown
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
# ops that move no data: views, allocations, metadata
NO_DATA = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand", "expand_as",
    "as_strided", "as_strided_", "select", "slice", "unsqueeze", "squeeze", "flatten", "unflatten", "narrow",
    "split", "split_with_sizes", "chunk", "unbind", "alias", "detach", "detach_", "numpy_T", "view_as",
    "lift_fresh", "resize_", "contiguous", "empty", "empty_like", "empty_strided", "set_", "_has_compatible_shallow_copy_type",
    "is_same_size", "size", "stride", "dim", "result_type", "_to_copy_meta", "to", "type_as", "_nested_tensor_from_mask_left_aligned",
    "new_empty", "new_empty_strided", "unsafe_split", "movedim", "swapaxes", "mT", "diagonal", "_unsafe_index_put_meta",
}
WRITE_ONLY = {"zero_", "fill_", "copy_", "bernoulli_", "normal_", "uniform_", "random_", "exponential_", "index_put_"}
REDUCTIONS = {
    "sum", "mean", "max", "min", "amax", "amin", "norm", "linalg_vector_norm", "var", "std", "var_mean", "std_mean",
    "argmax", "argmin", "all", "any", "_local_scalar_dense", "item", "nll_loss_forward", "nll_loss", "nll_loss_nd",
    "prod", "logsumexp", "count_nonzero", "dot", "vdot", "is_nonzero", "equal", "allclose", "_foreach_norm",
}
CAUSES = ["compute", "memory", "no work", "unknown", "between ops"]
# the spans torch.compile's regions run in (Dynamo's frame, AOTAutograd's functions, the compiled graph)
COMPILED_SPANS = {"CompiledFunction", "CompiledFunctionBackward"}
COMPILED_CODE = "compiled code"  # a compiled region's own kernels: its time less the calls it makes
PHASES = ["forward", "loss", "backward", "optimizer"]


def timing_path(trace: str | Path) -> Path:
    """Where the light trace of a shaped trace's steps goes (times only; ``capture`` writes it)."""
    return Path(f"{trace}.timing.json")


@dataclass(frozen=True)
class Ceilings:
    """The machine's ceilings: GEMM GFLOP/s per dtype and memory-copy GB/s (read + write)."""

    gemm_gflops: dict
    copy_gbs: float
    threads: int | None = None
    source: str = ""
    theoretical_gflops: dict = field(default_factory=dict)  # per dtype, None where unknown (``peak.theoretical``)

    @classmethod
    def from_roofline(cls, roofline: dict, source: str = "", theoretical: dict | None = None) -> "Ceilings":
        """From notebook 00's roofline (``roofline.measure``): best GEMM and copy rates; ``theoretical``:
        the CPU's theoretical peak per dtype beside them (``Session.theoretical_gflops``)."""
        try:
            gemm = {"fp32": float(roofline["gemm_gflops_best"])}
            copy = float(roofline["copy_gbs_best"])
            if roofline.get("gemm_gflops_bf16_best"):
                gemm["bf16"] = float(roofline["gemm_gflops_bf16_best"])
        except (KeyError, TypeError, ValueError):
            gemm, copy = {}, math.nan
        if not gemm or not all(math.isfinite(v) and v > 0 for v in (*gemm.values(), copy)):
            raise CpuoptError("a roofline needs gemm_gflops_best and copy_gbs_best, positive rates (as `python -m "
                              "cpuopt_helpers.roofline` prints them)")
        return cls(gemm, copy, roofline.get("threads"), source, dict(theoretical or {}))

    def gemm_for(self, dtype: str) -> float | None:
        return self.gemm_gflops.get(dtype)


@dataclass
class Node:
    """One operator span and the spans nested in it."""

    name: str
    ts: float
    dur: float
    args: dict
    children: list = field(default_factory=list)

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class Work:
    """What a span (and everything under it) did, and the time it would take at its ceilings."""

    flops: float = 0.0
    bytes: float = 0.0
    compute_s: float = 0.0  # ceiling time of the units bound by the GEMM rate
    memory_s: float = 0.0  # ceiling time of the units bound by bandwidth
    unknown_us: float = 0.0  # measured time of spans whose work is unknown
    dtype: str | None = None
    shapes: str = ""

    def __add__(self, other: "Work") -> "Work":
        # the dtype a GEMM below ran in, before a copy's: under autocast a span's first child casts
        # its fp32 inputs and the convolution after it runs in bf16
        gemm = self if self.flops or not other.flops else other
        return Work(self.flops + other.flops, self.bytes + other.bytes, self.compute_s + other.compute_s,
                    self.memory_s + other.memory_s, self.unknown_us + other.unknown_us,
                    gemm.dtype or self.dtype or other.dtype, self.shapes or other.shapes)


# ---------------------------------------------------------------------------------- reading a trace

def build_forest(events: list[dict]) -> tuple[list[Node], list[tuple[str, float, float]]]:
    """Top-level operator spans (with their nested spans as children), and the user annotations."""
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "dur" in e),
                 key=lambda e: (e.get("tid"), float(e["ts"]), -float(e["dur"])))
    tops: list[Node] = []
    stack: list[Node] = []
    tid = object()
    for e in ops:
        node = Node(e["name"], float(e["ts"]), float(e["dur"]), e.get("args") or {})
        if e.get("tid") != tid:
            tid, stack = e.get("tid"), []
        while stack and node.ts >= stack[-1].end:
            stack.pop()
        (stack[-1].children if stack else tops).append(node)
        stack.append(node)
    notes = [(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if e.get("ph") == "X" and e.get("cat") == "user_annotation" and "dur" in e]
    return sorted(tops, key=lambda n: n.ts), notes


def tensor_inputs(args: dict) -> list[tuple[list[int], str]] | None:
    """(dims, dtype) of each tensor input; None when a tensor list hides its shapes."""
    types, dims = args.get("Input type") or [], args.get("Input Dims") or []
    out = []
    for i, kind in enumerate(types):
        if kind in UNKNOWN_TENSORS:
            return None
        if kind in ELEMENT_BYTES:
            shape = dims[i] if i < len(dims) and isinstance(dims[i], list) else []
            out.append(([int(d) for d in shape], kind))
    return out


def nbytes(shape: list[int], dtype: str) -> int:
    return math.prod(shape) * ELEMENT_BYTES.get(dtype, 4)


def _concrete(args: dict, i: int):
    values = args.get("Concrete Inputs") or []
    try:
        return json.loads(values[i].replace("True", "true").replace("False", "false"))
    except (IndexError, ValueError, AttributeError):
        return None


def _dtype_class(dtype: str) -> str:
    return "bf16" if dtype == "c10::BFloat16" else "fp32"


# ---------------------------------------------------------------------------------- work of one op

def _conv_out(x: list[int], w: list[int], stride, padding, dilation, transposed, output_padding, groups) -> list[int]:
    spatial = len(x) - 2
    pick = lambda v, i, d: (v[i] if isinstance(v, list) and len(v) > i else (v[0] if isinstance(v, list) and v else d))
    out = [x[0], w[1] * (groups or 1) if transposed else w[0]]
    for i in range(spatial):
        k, s, p, d = w[2 + i], pick(stride, i, 1), pick(padding, i, 0), pick(dilation, i, 1)
        if transposed:
            out.append((x[2 + i] - 1) * s - 2 * p + d * (k - 1) + pick(output_padding, i, 0) + 1)
        else:
            out.append((x[2 + i] + 2 * p - d * (k - 1) - 1) // s + 1)
    return out


CONVOLUTIONS = ("convolution", "_convolution", "convolution_backward")


def _conv_geometry(args: dict, op: str) -> list:
    """A convolution's stride, padding and dilation, as its trace recorded them (None where it did not)."""
    first = 4 if op == "convolution_backward" else 3
    return [_concrete(args, first + i) for i in range(3)]


def _guessed_conv(name: str, args: dict) -> bool:
    """A convolution whose trace lacks its stride, padding or dilation: its work would be a guess."""
    op = name.removeprefix("aten::")
    return op in CONVOLUTIONS and None in _conv_geometry(args, op)


def kernel_work(name: str, args: dict) -> tuple[float, float, str] | None:
    """(FLOPs, bytes, dtype) of a GEMM-like op from its recorded shapes; None for any other op."""
    op = name.removeprefix("aten::")
    ins = tensor_inputs(args)
    if not ins:
        return None
    dtype = ins[0][1]
    read = sum(nbytes(s, t) for s, t in ins)
    try:
        if op in ("mm", "addmm", "_addmm_activation", "bmm", "baddbmm"):
            a, b = (ins[0][0], ins[1][0]) if op in ("mm", "bmm") else (ins[1][0], ins[2][0])
            dtype = ins[0 if op in ("mm", "bmm") else 1][1]
            batch = a[0] if op in ("bmm", "baddbmm") else 1
            m, k, n = a[-2], a[-1], b[-1]
            return 2.0 * batch * m * k * n, read + batch * m * n * ELEMENT_BYTES[dtype], dtype
        if op in ("convolution", "_convolution"):
            x, w = ins[0][0], ins[1][0]
            out = _conv_out(x, w, _concrete(args, 3), _concrete(args, 4), _concrete(args, 5), _concrete(args, 6),
                            _concrete(args, 7), _concrete(args, 8))
            flops = conv_flops(x, w, out, bool(_concrete(args, 6)), *_conv_geometry(args, op))
            return float(flops), read + nbytes(out, dtype), dtype
        if op == "convolution_backward":
            grad, x, w = ins[0][0], ins[1][0], ins[2][0]
            mask = _concrete(args, 10) or [True, True, False]
            flops = conv_flops(x, w, grad, bool(_concrete(args, 7)), *_conv_geometry(args, op)) * (
                bool(mask[0]) + bool(mask[1]))
            written = mask[0] * nbytes(x, dtype) + mask[1] * nbytes(w, dtype) + mask[2] * w[0] * ELEMENT_BYTES[dtype]
            return float(flops), read + written, ins[1][1]
        if op in ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"):
            x, w_ih, w_hh = ins[0][0], ins[1][0], ins[2][0]
            flops = rnn_layer_flops(x, w_ih, w_hh) * (2 if op.endswith("backward") else 1)
            if op.endswith("backward"):  # gradients of input, weights, biases and states
                written = sum(nbytes(s, t) for s, t in ins[:7])
            else:  # the output sequence, the last states and the workspace
                written = nbytes(x[:-1] + [w_hh[1]], dtype) + sum(nbytes(s, t) for s, t in ins[5:7])
            return float(flops), read + written, dtype
        if op in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"):
            backward = op.endswith("backward")
            q, k, v = (ins[1][0], ins[2][0], ins[3][0]) if backward else (ins[0][0], ins[1][0], ins[2][0])
            flops = attention_flops(q, k, v) * (2 if backward else 1)
            written = (nbytes(q, dtype) + nbytes(k, dtype) + nbytes(v, dtype)) if backward else nbytes(q[:-1] + [v[-1]], dtype)
            return float(flops), read + written, dtype
    except (IndexError, TypeError, KeyError):
        return None
    return None


def own_bytes(name: str, args: dict) -> float | None:
    """Bytes an op that is not GEMM-like moves, from its own inputs (rules in the module docstring)."""
    op = name.removeprefix("aten::")
    if op in NO_DATA:
        return 0.0
    ins = tensor_inputs(args)
    if ins is None:
        return None
    if not ins:
        return None
    sizes = [nbytes(s, t) for s, t in ins]
    if op in WRITE_ONLY or op in REDUCTIONS:
        return float(sum(sizes))
    if op.endswith("_") and not op.startswith("_"):  # in place: self read and written back
        return float(sum(sizes) + sizes[0])
    return float(sum(sizes) + max(sizes))


def node_work(node: Node, ceilings: Ceilings) -> Work:
    """The work of a span and its nested spans, each unit at its ceiling; nothing counted twice."""
    shapes = _shapes(node.args)
    if _guessed_conv(node.name, node.args):
        return Work(unknown_us=node.dur, shapes=shapes)
    kernel = kernel_work(node.name, node.args)
    if kernel is not None:
        flops, moved, dtype = kernel
        peak = ceilings.gemm_for(_dtype_class(dtype))
        if peak is None:
            return Work(flops, moved, unknown_us=node.dur, dtype=_dtype_class(dtype), shapes=shapes)
        t_c, t_m = flops / (peak * 1e9), moved / (ceilings.copy_gbs * 1e9)
        return Work(flops, moved, t_c if t_c >= t_m else 0.0, t_m if t_m > t_c else 0.0,
                    dtype=_dtype_class(dtype), shapes=shapes)
    below = sum((node_work(c, ceilings) for c in node.children), Work())
    own = own_bytes(node.name, node.args)
    if below.flops or own is None:  # a GEMM below (linear -> addmm), or nothing known here: the children's sum
        if own is None and not node.children:
            return Work(unknown_us=node.dur, shapes=shapes)
        # an autograd node records only the gradient it takes: the GEMM's shapes below say which layer it is
        named = below.shapes if below.flops and _autograd_node(node.name) else shapes or below.shapes
        return Work(below.flops, below.bytes, below.compute_s, below.memory_s, below.unknown_us, below.dtype, named)
    if below.bytes > own:
        return Work(0.0, below.bytes, below.compute_s, below.memory_s, below.unknown_us, below.dtype,
                    shapes or below.shapes)
    dtype = (tensor_inputs(node.args) or [([], None)])[0][1]
    return Work(0.0, own, 0.0, own / (ceilings.copy_gbs * 1e9), dtype=dtype and _dtype_class(dtype),
                shapes=shapes or below.shapes)


def _autograd_node(name: str) -> bool:
    """A backward span of autograd's (``ConvolutionBackward0``, with or without the engine's prefix)."""
    return name.startswith(BACKWARD_PREFIX) or bool(re.search(r"Backward\d*$", name))


def _shapes(args: dict) -> str:
    ins = tensor_inputs(args) or []
    return "; ".join("x".join(map(str, s)) or "scalar" for s, _ in ins)


def tensor_layout(dims: list, strides: list) -> str | None:
    """``channels-last`` or ``NCHW`` for one 4-D tensor's strides, compared as torch does: the batch's
    stride and dimensions of size 1 left out (they say nothing of the order); None where both fit
    (one channel, a 1x1 image) or neither."""
    if not (isinstance(dims, list) and len(dims) == 4 and isinstance(strides, list) and len(strides) == 4):
        return None
    _, c, h, w = dims
    expected = {"NCHW": (h * w, w, 1), "channels-last": (1, w * c, c)}  # strides of C, H, W
    fits = [name for name, want in expected.items()
            if all(size == 1 or stride == wanted for size, stride, wanted in zip((c, h, w), strides[1:], want))]
    return fits[0] if len(fits) == 1 else None


def input_layout(args: dict, name: str = "") -> str | None:
    """The memory layout an op ran in, from the strides the profiler records: its first tensor whose
    layout can be read; for a convolution's backward (grad_output, input, weight) the input's, then
    the weight's, as PyTorch chooses the kernel's layout from them. None where none can be read."""
    pairs = list(zip(args.get("Input Dims") or [], args.get("Input Strides") or []))
    if "convolution_backward" in name and len(pairs) >= 3:
        pairs = [pairs[1], pairs[2], pairs[0]]
    return next((layout for layout in (tensor_layout(d, s) for d, s in pairs) if layout), None)


def layout_of(trace: str | Path, shapes: str) -> str | None:
    """The layout (``input_layout``) most calls with these input shapes ran in: under ``torch.compile``
    Inductor may turn a model's convolutions channels-last, so the model's own layout need not be the
    step's. None where no call with these shapes recorded its strides."""
    seen: dict[str, int] = {}
    for e in load_events(trace):
        args = e.get("args") or {}
        if e.get("cat") == "cpu_op" and "Input Strides" in args and _shapes(args) == shapes:
            layout = input_layout(args, e.get("name", ""))
            if layout:
                seen[layout] = seen.get(layout, 0) + 1
    return max(seen, key=seen.get) if seen else None


# ---------------------------------------------------------------------------------- the projection

def _phase(node: Node, notes: list[tuple[str, float, float]]) -> str:
    if node.name.startswith(BACKWARD_PREFIX):
        return "backward"
    for name, start, end in notes:
        if start <= node.ts < end:
            if name.startswith("Optimizer."):
                return "optimizer"
            if name == "cpuopt::loss":
                return "loss"
    return "forward"


def timed_spans(tops: list[Node], timing_events: list[dict] | None) -> list[Node] | None:
    """The light trace's top-level spans, one per span of the shaped trace; None when they differ."""
    if not timing_events:
        return None
    timed, _ = build_forest(timing_events)
    if [n.name for n in timed] != [n.name for n in tops]:
        log.warning("the light trace's operators differ from the shaped trace's (%d against %d spans): "
                    "keeping the shaped trace's times", len(timed), len(tops))
        return None
    return timed


def compiled_parts(node: Node) -> list[Node] | None:
    """A compiled region's parts: the calls its generated code makes (convolutions, GEMMs, other
    ATen ops: the spans nested in its ``COMPILED_SPANS``) and one span for the rest of the region's
    time, its own code (Inductor's kernels, which the profiler does not see: ``COMPILED_CODE``,
    work unknown). None for a span that holds no compiled region."""
    calls: list[Node] = []

    def collect(region: Node) -> None:
        for c in region.children:
            if _compiled(c):
                collect(c)
            else:
                calls.append(c)

    def walk(n: Node) -> bool:
        found = False
        for c in n.children:
            if _compiled(c):
                collect(c)
                found = True
            else:
                found = walk(c) or found
        return found

    if _compiled(node):
        collect(node)
    elif not walk(node):
        return None
    own = max(node.dur - sum(c.dur for c in calls), 0.0)
    return calls + [Node(COMPILED_CODE, node.ts, own, {})]


def _compiled(node: Node) -> bool:
    return node.name in COMPILED_SPANS or node.name.startswith(COMPILED_PREFIXES)


def row_spans(node: Node, timed: Node | None) -> list[tuple[Node, float, float]]:
    """(span with shapes, start, duration) of each row a top-level span gives: itself, or a compiled
    region's parts, their times from the light trace's same span where its parts match by name,
    else scaled from the shaped trace's to the light trace's span."""
    timed = timed or node
    parts = compiled_parts(node)
    if parts is None:
        return [(node, timed.ts, timed.dur)]
    light = compiled_parts(timed)
    if light is not None and [p.name for p in light] == [p.name for p in parts]:
        return [(p, q.ts, q.dur) for p, q in zip(parts, light)]
    scale = timed.dur / node.dur if node.dur > 0 else 1.0
    return [(p, timed.ts + (p.ts - node.ts) * scale, p.dur * scale) for p in parts]


def operator_rows(events: list[dict], ceilings: Ceilings, timing_events: list[dict] | None = None) -> pd.DataFrame:
    """One row per top-level operator span (a compiled region: one per part, ``compiled_parts``):
    measured time, work, ceiling time, bound and cause.

    Work comes from ``events`` (a trace with shapes); times from ``timing_events`` (a light trace
    of the same steps) where its spans match one to one, else from ``events``.
    """
    tops, notes = build_forest(events)
    timed = timed_spans(tops, timing_events)
    rows = []
    for i, top in enumerate(tops):
        end = timed[i].end if timed else top.end
        for node, ts, dur in row_spans(top, timed[i] if timed else None):
            rows.append(operator_row(node, ts, dur, end, _phase(top, notes), ceilings))
    out = pd.DataFrame(rows)
    out.attrs["timing"] = "light trace" if timed else "shaped trace"
    out.attrs["shaped_wall_us"] = (max(n.end for n in tops) - min(n.ts for n in tops)) if tops else 0.0
    return out


def operator_row(node: Node, ts: float, dur: float, end: float, phase: str, ceilings: Ceilings) -> dict:
    """One row: a span's work (from the shaped trace) in the time measured for it (``ts``, ``dur``);
    ``end``: where its top-level span ends (a compiled region's parts share their region's)."""
    w = node_work(node, ceilings)
    # the known and unknown parts of the span in the light trace's time, in the same proportion
    share = min(max(w.unknown_us / node.dur, 0.0), 1.0) if node.dur > 0 else 1.0
    w.unknown_us = 0.0 if share == 0 else dur if share == 1 else dur * share
    known_us = dur - w.unknown_us
    ideal_us = (w.compute_s + w.memory_s) * 1e6
    if known_us <= 0:
        bound = "unknown"
    elif w.compute_s >= w.memory_s and w.compute_s > 0:
        bound = "compute"
    elif w.memory_s > 0:
        bound = "memory"
    else:
        bound = "no work"
    return {
        "op": node.name.removeprefix(BACKWARD_PREFIX), "phase": phase, "shapes": w.shapes,
        "dtype": w.dtype, "ts_us": ts, "time_us": dur, "end_us": end, "flops": w.flops, "bytes": w.bytes,
        "bound": bound, "ideal_us": ideal_us, "unknown_us": w.unknown_us,
        # at most the measured time: a row measured faster than its ceiling keeps its time
        "projected_us": min(ideal_us, max(known_us, 0.0)) + w.unknown_us,
        "above_ceiling": bool(known_us > 0 and ideal_us > known_us),
    }


def trace_steps(path: str | Path, events: list[dict]) -> int | None:
    """Steps the trace covers: from FILE.ops.json (``cpuopt bench --trace``), else the optimizer's
    steps; None where neither says (the trace's times are then for the whole trace, and said so)."""
    try:
        return int(json.loads(Path(f"{path}.ops.json").read_text())["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        steps = sum(1 for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(
            "Optimizer.step"))
        return steps or None


def project(rows: pd.DataFrame, steps: int, ceilings: Ceilings, wall_us: float,
            plain_step_ms: float | None = None) -> dict:
    """The projection of the step from its operator rows: coverage, projected step, gap by cause."""
    op_us = float(rows["time_us"].sum())
    between_us = max(wall_us - op_us, 0.0)
    known = rows["time_us"] - rows["unknown_us"]
    covered_us = float(known[rows["bound"] != "unknown"].sum())
    gap = (rows["time_us"] - rows["projected_us"]).clip(lower=0)
    causes = {c: float(gap[rows["bound"] == c].sum()) / 1e3 / steps for c in ("compute", "memory")}
    causes["no work"] = float(gap[rows["bound"] == "no work"].sum()) / 1e3 / steps  # all but unknown children
    causes["unknown"] = 0.0  # unknown work keeps its measured time in the projection: no gap to claim
    causes["between ops"] = between_us / 1e3 / steps
    step_ms = wall_us / 1e3 / steps
    projected_ms = float(rows["projected_us"].sum()) / 1e3 / steps
    # each stretch between operators goes to the phase of the operator it leads to
    order = rows.sort_values("ts_us")
    ends = order["end_us"].cummax().shift()  # a compiled region's parts: no wait between them
    waits = (order["ts_us"] - ends).clip(lower=0).fillna(0.0).groupby(order["phase"]).sum()
    between_by_phase = {p: float(waits[p]) / 1e3 / steps for p in PHASES if p in waits.index}
    flops, moved = float(rows["flops"].sum()), float(rows["bytes"].sum())
    return {
        "steps": steps, "step_ms": step_ms, "plain_step_ms": plain_step_ms,
        "operator_ms": op_us / 1e3 / steps, "between_ops_ms": between_us / 1e3 / steps,
        "between_ops_share": between_us / wall_us if wall_us else 0.0, "between_ops_by_phase_ms": between_by_phase,
        "coverage": covered_us / op_us if op_us else 0.0,
        "step_coverage": covered_us / wall_us if wall_us else 0.0,  # the same time over the whole step
        "unknown_ms": float(rows["unknown_us"].sum()) / 1e3 / steps,
        "projected_ms": projected_ms, "speedup_bound": step_ms / projected_ms if projected_ms else None,
        "gap_ms": causes, "gap_share": {k: v / step_ms for k, v in causes.items()} if step_ms else {},
        "gflop_per_step": flops / 1e9 / steps, "gb_per_step": moved / 1e9 / steps,
        "achieved_gflops": flops / (op_us * 1e-6) / 1e9 if op_us else None,
        "ceilings": {"gemm_gflops": ceilings.gemm_gflops, "copy_gbs": ceilings.copy_gbs,
                     "threads": ceilings.threads, "source": ceilings.source},
        "top_level_per_step": len(rows) / steps,
        "above_ceiling_share": float(rows.loc[rows["above_ceiling"], "time_us"].sum() / op_us) if op_us else 0.0,
        # the same split by bound: above the GEMM ceiling (a plain GEMM beaten), above the copy rate (data in cache)
        "above_ceiling_by_bound": {b: float(rows.loc[rows["above_ceiling"] & (rows["bound"] == b), "time_us"].sum()
                                            / op_us) if op_us else 0.0 for b in ("compute", "memory")},
        "operator_rows": None,
    }


def whole_step(trace: str | Path, ceilings: Ceilings, steps: int | None = None,
               plain_step_ms: float | None = None, timing: str | Path | None = "auto",
               events: list | None = None) -> dict:
    """Read a trace of timed steps and project the whole step (see the module docstring).

    ``timing``: the light trace the times come from; "auto" takes ``timing_path(trace)`` where it
    exists and is not older than the trace, None uses the shaped trace's own times. Returns the projection's figures
    (``project``) with ``rows`` (one per top-level span) and ``table`` (``operator_table``: grouped
    per step); ``timing`` says where the times came from, ``shaped_step_ms`` is the step under
    the shaped trace. ``events``: the trace's, already read (``load_events``).
    """
    events = load_events(trace) if events is None else events
    if timing == "auto":  # the light trace written after this one (not a stale one from an earlier capture)
        light = timing_path(trace)
        timing = light if light.exists() and light.stat().st_mtime >= Path(trace).stat().st_mtime else None
    rows = operator_rows(events, ceilings, load_events(timing) if timing else None)
    if rows.empty:
        raise CpuoptError(f"trace {trace} holds no operator spans; record the timed steps with `cpuopt bench --trace FILE`")
    has_shapes = any("Input Dims" in (e.get("args") or {}) for e in events if e.get("cat") == "cpu_op")
    if not has_shapes:
        raise CpuoptError(f"trace {trace} has no input shapes (recorded without record_shapes); record it again "
                          "with `cpuopt bench --trace FILE`")
    counted = steps or trace_steps(trace, events)
    steps = counted or 1  # unknown: the whole trace as one step, and the findings say so
    wall_us = float(rows["end_us"].max() - rows["ts_us"].min())
    out = project(rows, steps, ceilings, wall_us, plain_step_ms)
    out["timing"] = rows.attrs["timing"]
    out["steps_known"] = counted is not None
    out["shaped_step_ms"] = rows.attrs["shaped_wall_us"] / 1e3 / steps
    out["rows"] = rows
    out["table"] = operator_table(rows, steps, ceilings)
    out["operator_rows"] = len(out["table"])
    return out


def operator_table(rows: pd.DataFrame, steps: int, ceilings: Ceilings) -> pd.DataFrame:
    """Rows grouped by operator, phase and shapes, per step, with achieved rates and intensity."""
    keys = ["phase", "op", "shapes", "bound"]
    g = rows.fillna({"dtype": ""}).groupby(keys + ["dtype"], sort=False).agg(
        calls=("time_us", "size"), time_us=("time_us", "sum"), flops=("flops", "sum"), bytes=("bytes", "sum"),
        projected_us=("projected_us", "sum")).reset_index()
    g["calls"] = g["calls"] / steps
    g["ms"] = g["time_us"] / 1e3 / steps
    g["projected_ms"] = g["projected_us"] / 1e3 / steps
    g["gflop"] = g["flops"] / 1e9 / steps
    g["mb"] = g["bytes"] / 1e6 / steps
    seconds = g["time_us"] * 1e-6
    g["achieved_gflops"] = g["flops"] / seconds / 1e9
    g["achieved_gbs"] = g["bytes"] / seconds / 1e9
    g["intensity"] = (g["flops"] / g["bytes"]).where(g["bytes"] > 0)
    g["ceiling"] = [(ceilings.gemm_for(d or "fp32") if b == "compute" else ceilings.copy_gbs if b == "memory" else None)
                    for b, d in zip(g["bound"], g["dtype"])]
    g["ceiling_unit"] = g["bound"].map({"compute": "GFLOP/s", "memory": "GB/s"})
    g["of_ceiling"] = [(gf if b == "compute" else gb) / c if c else None
                       for b, gf, gb, c in zip(g["bound"], g["achieved_gflops"], g["achieved_gbs"], g["ceiling"])]
    peaks = [ceilings.theoretical_gflops.get(d or "fp32") if b == "compute" else None
             for b, d in zip(g["bound"], g["dtype"])]
    g["of_theoretical"] = [gf / p if p else None for gf, p in zip(g["achieved_gflops"], peaks)]
    total = g["ms"].sum()
    g["share"] = g["ms"] / total if total else 0.0
    cols = ["phase", "op", "shapes", "dtype", "bound", "calls", "ms", "share", "gflop", "mb", "intensity",
            "achieved_gflops", "achieved_gbs", "ceiling", "ceiling_unit", "of_ceiling", "of_theoretical", "projected_ms"]
    return g[cols].sort_values("ms", ascending=False).reset_index(drop=True)


def records(table: pd.DataFrame) -> list[dict]:
    """A table as JSON-ready records (NaN -> None)."""
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
            for row in table.to_dict(orient="records")]


def operator_view(table: pd.DataFrame, rows: int = 10) -> pd.DataFrame:
    """The heaviest operators as notebook 02 shows them: every share said against what it divides by
    (the measured GEMM ceiling of its dtype, or the copy rate), and no blank cell: a memory-bound
    operator has no compute peak to be a share of, an unknown ceiling or peak says so."""
    top = table.head(rows)
    no_share = {"no work": "no work (views, allocations)", "unknown": "work unknown"}

    def of_ceiling(r) -> str:
        if r["bound"] in no_share:
            return no_share[r["bound"]]
        if r["of_ceiling"] is None or pd.isna(r["of_ceiling"]):
            return "no ceiling measured"
        against = f"the {r['dtype'] or 'fp32'} GEMM ceiling" if r["bound"] == "compute" else "the copy rate"
        return f"{r['of_ceiling']:.0%} of {against}"

    def of_theory(r) -> str:
        if r["bound"] != "compute":
            return no_share.get(r["bound"], "not compute-bound")
        return "peak unknown" if r["of_theoretical"] is None or pd.isna(r["of_theoretical"]) else \
            f"{r['of_theoretical']:.0%}"

    def rate(r, column: str, digits: int):
        if r["bound"] in no_share:
            return no_share[r["bound"]]
        if not math.isfinite(r[column]):
            return "no time recorded"
        if column == "achieved_gflops" and r["bound"] == "memory" and not r[column]:
            return "not counted (not GEMM-like)"  # FLOPs count at GEMM-like operators only
        return round(float(r[column]), digits)

    return pd.DataFrame({
        "phase": top["phase"], "operator": top["op"], "input shapes": top["shapes"], "bound by": top["bound"],
        "calls a step": top["calls"].round(1), "ms a step": top["ms"].round(3), "share of operators' time":
        top["share"].map("{:.1%}".format), "GFLOP/s": top.apply(rate, axis=1, args=("achieved_gflops", 1)),
        "GB/s": top.apply(rate, axis=1, args=("achieved_gbs", 2)),
        "of its measured ceiling": top.apply(of_ceiling, axis=1),
        "of the theoretical peak": top.apply(of_theory, axis=1), "ms at its ceiling": top["projected_ms"].round(3)})


def cause_table(result: dict) -> pd.DataFrame:
    """The gap between the measured and projected step, by cause, in ms per step and share of the step."""
    return pd.DataFrame({"ms_per_step": result["gap_ms"], "share_of_step": result["gap_share"]}).loc[CAUSES]


def summary_row(result: dict) -> dict:
    """One line of a per-workload table: step, projection, coverage and the gap's causes."""
    row = {k: result[k] for k in ("step_ms", "plain_step_ms", "shaped_step_ms", "operator_ms", "projected_ms", "speedup_bound",
                                  "coverage", "step_coverage", "between_ops_share", "gflop_per_step", "gb_per_step")}
    row.update({f"gap_{k.replace(' ', '_')}_ms": v for k, v in result["gap_ms"].items()})
    row.update({f"between_{p}_ms": v for p, v in result["between_ops_by_phase_ms"].items()})
    return row


def wholestep_findings(result: dict, label: str = "") -> list[Finding]:
    """What one whole-step projection says, from its numbers (``label``: the workload's, said
    before each sentence)."""
    found = [] if result.get("steps_known", True) else [Finding(label, STAGE, "whole step count unknown")]
    found.append(Finding(label, STAGE, "whole step coverage", {
        **{k: float(result[k]) for k in ("coverage", "top_level_per_step", "between_ops_share", "step_ms",
                                         "step_coverage")},
        "plain_step_ms": float(result["plain_step_ms"]) if result["plain_step_ms"] else result["plain_step_ms"],
        "shaped_step_ms": float(result["shaped_step_ms"]) if result.get("timing") == "light trace" else None}))
    found.append(Finding(label, STAGE, "whole step projection", {
        "projected_ms": float(result["projected_ms"]), "step_ms": float(result["step_ms"]),
        "speedup_bound": float(result["speedup_bound"]) if result["speedup_bound"] else result["speedup_bound"],
        "gap_ms": {k: float(v) for k, v in result["gap_ms"].items()}}))
    waits = result.get("between_ops_by_phase_ms") or {}
    if sum(waits.values()) > 0:
        found.append(Finding(label, STAGE, "whole step between ops",
                             {"between_ops_ms": {k: float(v) for k, v in waits.items()}}))
    table = result["table"]
    gemm = table[(table["bound"] == "compute") & table["of_ceiling"].notna()]  # those with a measured ceiling
    if len(gemm):
        theory = gemm["of_theoretical"]
        found.append(Finding(label, STAGE, "whole step gemm", {
            # the time-weighted average of each one's share: the time they would take at the ceiling over their time
            "of_ceiling": float((gemm["of_ceiling"] * gemm["ms"]).sum() / gemm["ms"].sum()),
            "ms": float(gemm["ms"].sum()), "at_ceiling_ms": float((gemm["of_ceiling"] * gemm["ms"]).sum()),
            "no_ceiling_ms": float(table.loc[(table["bound"] == "compute") & table["of_ceiling"].isna(), "ms"].sum()),
            "heaviest": gemm.iloc[0]["op"], "shapes": gemm.iloc[0]["shapes"],
            "heaviest_of_ceiling": float(gemm.iloc[0]["of_ceiling"]),
            # the same shares of the theoretical peak; None where the CPU is not in peak.CORES
            "of_theoretical": float((theory * gemm["ms"]).sum() / gemm["ms"].sum()) if theory.notna().all() else None,
            "heaviest_of_theoretical": None if pd.isna(theory.iloc[0]) else float(theory.iloc[0])}))
    if result["above_ceiling_share"] > 0.01:
        found.append(Finding(label, STAGE, "whole step above ceiling", {"share": float(result["above_ceiling_share"]),
                                                                        **result.get("above_ceiling_by_bound", {})}))
    return found


# ---------------------------------------------------------------------------------- oneDNN primitives

def conv_work(problem: str, deconvolution: bool, size: int) -> tuple[float | None, float | None]:
    """A convolution primitive's FLOPs (its taps on the input: ``conv_taps``) and bytes (source, weights and
    destination once, ``size`` bytes an element); (None, None) where its problem does not parse."""
    p = parse_conv(problem)
    if not p:
        return None, None
    space = lambda pre: math.prod(p[f"{pre}{d}"] for d in p["dims"])  # noqa: E731
    kernel = math.prod(p[f"k{d}"] for d in p["dims"])
    src, dst = p["mb"] * p["ic"] * space("i"), p["mb"] * p["oc"] * space("o")
    wei = p["oc"] * (p["ic"] // p["g"]) * kernel
    return 2.0 * p["mb"] * p["oc"] * (p["ic"] // p["g"]) * conv_taps(p, deconvolution), float(src + wei + dst) * size


def primitive_roofline(exec_df: pd.DataFrame, ceilings: Ceilings, steps: int | None = None) -> pd.DataFrame:
    """Achieved GFLOP/s and GB/s per distinct oneDNN primitive of a parsed log, where its problem gives shapes.

    FLOPs for convolutions (``parse_conv``; padded taps are not work, as benchdnn counts: ``conv_taps``),
    matmul and inner product; bytes from the problem's
    tensor sizes (source, weights, destination) and the line's data type. Other kinds: bytes
    from the problem's dims (read once, written once). Each is a call's, times the calls of the
    log; ``gflop``, ``mb``, ``calls`` and ``ms`` a step's (the log's over ``steps``).
    """
    if exec_df.empty:
        return pd.DataFrame()
    steps = steps or 1
    g = exec_df.groupby(["kind", "prop", "data_type", "problem"], sort=False).agg(
        calls=("time_ms", "size"), time_ms=("time_ms", "sum")).reset_index()
    flops, moved = [], []
    for kind, prop, dt, problem in zip(g["kind"], g["prop"], g["data_type"], g["problem"]):
        size = {"bf16": 2, "f16": 2, "s8": 1, "u8": 1, "f64": 8}.get(str(dt), 4)
        f = b = None
        if kind in ("convolution", "deconvolution"):
            f, b = conv_work(str(problem), kind == "deconvolution", size)
        elif kind == "inner_product":
            p = {k: int(v) for k, v in re.findall(r"(mb|ic|oc|ih|iw|id)(\d+)", str(problem))}
            if {"mb", "ic", "oc"} <= set(p):
                ic = p["ic"] * p.get("ih", 1) * p.get("iw", 1) * p.get("id", 1)
                f, b = 2.0 * p["mb"] * ic * p["oc"], float(p["mb"] * ic + ic * p["oc"] + p["mb"] * p["oc"]) * size
        else:
            dims = [d for d in parse_dims(str(problem)) if d]
            if kind == "matmul" and len(dims) >= 2:
                a, w = dims[0], dims[1]
                batch = math.prod(a[:-2]) if len(a) > 2 else 1
                f = 2.0 * batch * a[-2] * a[-1] * w[-1]
                b = float(math.prod(a) + math.prod(w) + batch * a[-2] * w[-1]) * size
            elif dims:
                b = 2.0 * math.prod(dims[0]) * size
        flops.append(f)
        moved.append(b)
    flops, moved = ([x * n if x else None for x, n in zip(xs, g["calls"])] for xs in (flops, moved))  # x the calls
    g["gflop"] = [f / 1e9 / steps if f else None for f in flops]
    g["mb"] = [b / 1e6 / steps if b else None for b in moved]
    seconds = g["time_ms"] / 1e3
    g["achieved_gflops"] = [f / s / 1e9 if f and s > 0 else None for f, s in zip(flops, seconds)]
    g["achieved_gbs"] = [b / s / 1e9 if b and s > 0 else None for b, s in zip(moved, seconds)]
    g["intensity"] = [f / b if f and b else None for f, b in zip(flops, moved)]
    g["calls"] = g["calls"] / steps
    g["ms"] = g["time_ms"] / steps
    dtypes = ["bf16" if dt == "bf16" else "fp32" for dt in g["data_type"]]
    peak = [ceilings.gemm_for(dt) for dt in dtypes]
    theory = [ceilings.theoretical_gflops.get(dt) for dt in dtypes]
    g["of_gemm_ceiling"] = [a / p if a and p else None for a, p in zip(g["achieved_gflops"], peak)]
    g["of_theoretical"] = [a / p if a and p else None for a, p in zip(g["achieved_gflops"], theory)]
    g["of_copy_ceiling"] = g["achieved_gbs"] / ceilings.copy_gbs
    cols = ["kind", "prop", "data_type", "problem", "calls", "ms", "gflop", "mb", "intensity", "achieved_gflops",
            "achieved_gbs", "of_gemm_ceiling", "of_theoretical", "of_copy_ceiling"]
    return g[cols].sort_values("ms", ascending=False).reset_index(drop=True)


# ---------------------------------------------------------------------------------- edges: ceilings, capture

def machine_ceilings(preset: str = "quick", roofline_file: str | None = None) -> Ceilings:
    """This machine's roofline: from a JSON file, else the results store (notebook 00), else measured now."""
    if roofline_file:
        try:
            return Ceilings.from_roofline(json.loads(Path(roofline_file).read_text()), roofline_file)
        except (OSError, ValueError) as exc:
            raise CpuoptError(f"cannot read roofline {roofline_file}: {exc}") from None
    from cpuopt_helpers import peak, roofline, system
    from cpuopt_helpers.results import ResultStore

    facts = system.collect_facts()
    store, machine = ResultStore(), facts.fingerprint

    def ceilings(value: dict, source: str) -> Ceilings:  # the theoretical peak of the cores it measured on
        cores = int(value.get("threads") or facts.physical_cores)
        theory = peak.theoretical(system.read_cpuinfo(), cores, clock=peak.stored_clock(value))
        return Ceilings.from_roofline(value, source, theory["theoretical_gflops"])

    for name in dict.fromkeys([preset, "full", "standard", "quick"]):
        value = store.get_fact(machine, f"roofline/{name}")
        if value:
            return ceilings(value, f"results store, roofline/{name}")
    log.warning("no roofline stored for this machine: measuring it now (%s preset)", preset)
    value = roofline.measure(preset)
    store.put_fact(machine, f"roofline/{preset}", value)
    return ceilings(value, f"measured now, roofline/{preset}")


def timing_config(config, trace: str | Path):
    """The run that records the light trace (times only) beside a shaped trace."""
    return config.replace(trace=str(timing_path(trace)), trace_shapes=False)


def capture(config, trace: str | Path, plain: bool = True) -> tuple[dict, dict, dict | None]:
    """Run a configuration with its timed steps traced with shapes, again with a light trace
    (``timing_path``) and, with ``plain``, once without the profiler, for the unprofiled step
    time; each in a fresh worker. Returns the (traced, timed, plain) RunResults."""
    from cpuopt_helpers import launch, system

    facts = system.collect_facts()
    plain_result = launch.run(config, facts) if plain else None
    traced = launch.run(config.replace(trace=str(trace)), facts)
    timed = launch.run(timing_config(config, trace), facts)
    return traced, timed, plain_result
