"""Tracing: a torch.profiler capture of the timed steps, read for where time goes between kernels.

The paper's third profiling tool: for memory- or cache-bound steps, the ordered spans of
the step. A step broken into very many short operator spans spends its time in dispatch
and context switches; a merged custom operator may pay. ``cpuopt bench --trace FILE``
records the timed steps (Chrome trace in FILE, open it in chrome://tracing or Perfetto;
operator totals in FILE.ops.json); this module reads both.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pandas as pd

from cpuopt_helpers.decisions import Finding
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.profiledn.breakdown import STAGE

# Operators that hand their work to oneDNN on CPU (convolutions and mkldnn_* ops).
ONEDNN_OPS = re.compile(r"mkldnn|onednn|convolution_backward|_convolution\b")


def load_events(path: str | Path) -> list[dict]:
    """The events of a Chrome trace, every complete span ("ph": "X") with a name, a start and a
    duration; one line of error for a missing, unreadable or malformed file."""
    path = Path(path)
    if path.is_dir():
        raise CpuoptError(f"{path} is a folder; name a trace file from `cpuopt bench --trace FILE`")
    try:
        text = path.read_text()
        if text.lstrip().startswith("onednn_verbose"):
            raise CpuoptError(f"{path} is a oneDNN verbose log, not a trace; give it as LOG and the trace as "
                              "--trace FILE (`cpuopt profile LOG --whole-step --trace TRACE`)")
        if not text.strip():
            raise CpuoptError(f"{path} is empty; record a trace with `cpuopt bench --trace FILE`")
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise CpuoptError(f"cannot read trace {path}: {getattr(exc, 'strerror', None) or exc}; "
                          "record one with `cpuopt bench --trace FILE`") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise CpuoptError(f"{path} is not a Chrome trace (no traceEvents); record one with `cpuopt bench --trace FILE`")
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            try:
                e["ts"], e["dur"] = float(e["ts"]), float(e["dur"])
                if not isinstance(e["name"], str):
                    raise TypeError("name is not a string")
            except (KeyError, TypeError, ValueError) as exc:
                raise CpuoptError(f"trace {path} has a span without its name, ts or dur ({exc!r}): not a PyTorch "
                                  "profiler trace; record one with `cpuopt bench --trace FILE`") from None
    return events


def load_spans(path: str | Path) -> pd.DataFrame:
    """The operator spans (name, thread, start and duration in µs) of a Chrome trace."""
    rows = [(e["name"], e.get("tid"), e["ts"], e["dur"]) for e in load_events(path)
            if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "dur" in e]
    return pd.DataFrame(rows, columns=["name", "tid", "ts_us", "dur_us"]).sort_values(["tid", "ts_us"])


LOSS_SPAN = "cpuopt::loss"  # worker.LOSS_SPAN: the worker marks the loss's forward with it
BACKWARD_NODE = "autograd::engine::evaluate_function: "


def loss_backward(path: str | Path, steps: int) -> dict | None:
    """The loss's share of the backward pass, read from a trace of the real step.

    The forward ops inside the worker's loss span carry autograd sequence numbers; each
    backward node (``autograd::engine::evaluate_function: XBackward0``) carries the number of
    the forward op it differentiates. The loss's backward is the time of the nodes whose
    numbers belong to the loss; the backward is the time of all nodes. None when the trace
    has no loss span (a trace recorded before the worker marked it) or no backward node.
    """
    events = load_events(path)
    spans = [(e.get("tid"), float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if e.get("ph") == "X" and e.get("name") == LOSS_SPAN]
    nodes = [e for e in events if e.get("ph") == "X" and e.get("name", "").startswith(BACKWARD_NODE)]
    if not spans or not nodes:
        return None
    loss_seq = {e["args"]["Sequence number"] for e in events
                if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "Sequence number" in e.get("args", {})
                and not e["name"].startswith(BACKWARD_NODE)
                and any(tid == e.get("tid") and start <= float(e["ts"]) < end for tid, start, end in spans)}
    total = sum(float(e["dur"]) for e in nodes) / 1e3
    loss = sum(float(e["dur"]) for e in nodes if e.get("args", {}).get("Sequence number") in loss_seq) / 1e3
    forward = sum(end - start for _, start, end in spans) / 1e3
    return {"loss_forward_ms": forward / steps, "loss_backward_ms": loss / steps, "backward_ms": total / steps,
            "loss_backward_share": loss / total if total else None}


def top_level(spans: pd.DataFrame) -> pd.DataFrame:
    """Spans not nested inside another span of the same thread: what the step is a sequence of."""
    keep, end = [], {}
    for row in spans.itertuples():
        if row.ts_us >= end.get(row.tid, float("-inf")):
            keep.append(row.Index)
            end[row.tid] = row.ts_us + row.dur_us
    return spans.loc[keep]


def load_ops(path: str | Path) -> tuple[pd.DataFrame, int]:
    """Operator totals written beside the trace (count, self and total CPU ms), and its steps."""
    try:
        data = json.loads(Path(f"{path}.ops.json").read_text())
    except (OSError, ValueError) as exc:
        raise CpuoptError(f"cannot read {path}.ops.json ({exc}); record the trace with `cpuopt bench --trace`") from None
    try:
        ops = pd.DataFrame(data["ops"])
        return ops.sort_values("self_cpu_ms", ascending=False).reset_index(drop=True), data["steps"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CpuoptError(f"{path}.ops.json lacks its operators' totals or steps ({exc!r}); record the trace again "
                          "with `cpuopt bench --trace`") from None


# the spans torch.compile's code runs in, each named by a frame number or a hash: said as what they are
COMPILED_NAMES = {"Torch-Compiled Region": "compiled regions (Dynamo's entry and guards)",
                  "## Call CompiledFxGraph": "compiled graphs (Inductor's generated kernels)"}
COMPILED_PREFIXES = tuple(COMPILED_NAMES)


def readable_operators(ops: pd.DataFrame) -> pd.DataFrame:
    """Operator totals with torch.compile's regions and graphs (one span name per frame or hash)
    each summed under one readable name, largest self time first."""
    def name(op: str) -> str:
        return next((words for prefix, words in COMPILED_NAMES.items() if op.startswith(prefix)), op)

    named = ops.assign(name=ops["name"].map(name))
    summed = named.groupby("name", as_index=False, sort=False).sum(numeric_only=True)
    return summed.sort_values("self_cpu_ms", ascending=False).reset_index(drop=True)


def summarize_trace(path: str | Path, top: int = 10) -> dict:
    """Top operators by self CPU time, the share outside oneDNN, and span fragmentation."""
    spans = load_spans(path)
    if spans.empty:
        raise CpuoptError(f"trace {path} holds no operator spans")
    ops, steps = load_ops(path)
    ops = readable_operators(ops)
    total_self = ops["self_cpu_ms"].sum()
    ops["share"] = ops["self_cpu_ms"] / total_self
    onednn = ops["name"].str.contains(ONEDNN_OPS)
    outer = top_level(spans)
    wall_ms = (spans["ts_us"] + spans["dur_us"]).max() / 1e3 - spans["ts_us"].min() / 1e3
    return {
        "steps": steps,
        "wall_ms_per_step": wall_ms / steps,
        "top_ops": ops.head(top)[["name", "count", "self_cpu_ms", "share"]],
        "outside_onednn_share": float(1 - ops.loc[onednn, "self_cpu_ms"].sum() / total_self),
        "ops_per_step": len(spans) / steps,
        "ops_per_ms": len(spans) / wall_ms,
        "median_span_us": statistics.median(spans["dur_us"]),
        "top_level_per_step": len(outer) / steps,
        "median_top_level_us": statistics.median(outer["dur_us"]),
        "short_span_share": float((spans["dur_us"] < 10).mean()),
        "loss": loss_backward(path, steps),
    }


def trace_findings(summary: dict, label: str = "") -> list[Finding]:
    """What one trace says, from its numbers (``label``: the profile's, said before each sentence)."""
    spans = {k: float(summary[k]) for k in ("ops_per_step", "ops_per_ms", "median_span_us", "short_span_share")}
    found = [
        Finding(label, STAGE, "trace top operators", {
            "operators": [[r["name"], float(r["share"])] for _, r in summary["top_ops"].head(3).iterrows()]}),
        Finding(label, STAGE, "trace outside onednn", {"share": float(summary["outside_onednn_share"])}),
        Finding(label, STAGE, "trace spans", spans),
    ]
    if summary["ops_per_ms"] > 20 or summary["median_span_us"] < 20:
        found.append(Finding(label, STAGE, "trace fragmented", {k: spans[k] for k in ("ops_per_ms", "median_span_us")}))
    loss = summary.get("loss")
    if loss and loss["loss_backward_share"] is not None:
        found.append(Finding(label, STAGE, "trace loss", {
            k: float(loss[k]) for k in ("loss_forward_ms", "loss_backward_ms", "loss_backward_share", "backward_ms")}))
    return found
