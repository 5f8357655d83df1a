"""Parse oneDNN verbose logs of every format into a table, streaming, never crashing.

Formats handled (the marker and the fields before the operation tell them apart):

| library version          | line starts with                                | fields after the operation |
|--------------------------|-------------------------------------------------|----------------------------|
| MKL-DNN 0.x              | ``mkldnn_verbose,exec,``                        | primitive, impl, prop, formats, aux, problem, time |
| MKL-DNN 1.x, DNNL <= 2.4 | ``mkldnn_verbose,exec,cpu,`` / ``dnnl_verbose,exec,cpu,`` | engine, primitive, impl, prop, mds, [attrs,] aux, problem, time |
| oneDNN 2.5 - 3.2         | ``onednn_verbose,exec,cpu,``                    | as above |
| oneDNN 3.1 - 3.2 builds  | ``onednn_verbose,v0,primitive,exec,cpu,``       | as above (the ``v0`` marker of the docs' 3.2 examples) |
| oneDNN 3.3 - 3.5         | ``onednn_verbose,primitive,exec,cpu,``          | as above; ``graph,`` lines for the graph API |
| oneDNN 3.6 on            | ``onednn_verbose,v1,primitive,exec,cpu,``       | as above (torch 2.13 prints this) |
| oneDNN Graph 0.x, 3.1-3.2| ``onednn_graph_verbose,exec,cpu,``              | partition id, partition kind, op names, formats, tensors, fpmath, backend, time |

With ``ONEDNN_VERBOSE_TIMESTAMP=1`` a timestamp (ms) stands before the API kind. Header
lines (``info``) give the library version, ISA, thread count and the ``template:`` line,
which names the field order when present. ``create:*``, ``compile:*`` (graph) and
``dispatch`` lines are kept apart from ``exec`` lines. Program output mixed into the log,
a truncated last line and malformed lines are counted and reported.
"""

from __future__ import annotations

import io
import math
import os
import re
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import pandas as pd

from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.flops import axis_taps

MARKERS = ("onednn_verbose", "dnnl_verbose", "mkldnn_verbose", "onednn_graph_verbose")
GRAPH_MARKER = "onednn_graph_verbose"  # oneDNN Graph's own prefix, before 3.3 merged it
VERSION_MARKERS = {"v0", "v1"}
GRAPH_FIELDS = ["engine", "partition_id", "partition_kind", "op_names", "data_formats", "logical_tensors",
                "fpmath_mode", "backend", "exec_time"]  # oneDNN Graph's documented order, when no template says
API_KINDS = {"primitive", "graph", "common", "ukernel"}
DTYPES = {"f32", "bf16", "f16", "s8", "u8", "s32", "f64", "f8_e5m2", "f8_e4m3", "s4", "u4", "e8m0", "f4_e2m1",
          "boolean", "undef"}
DIRECTIONS = {
    "forward_training": "forward", "forward_inference": "forward", "forward_scoring": "forward",
    "forward": "forward", "backward_data": "backward_data", "backward_weights": "backward_weights",
    "backward_bias": "backward_weights", "backward": "backward_data",
}
PRIMITIVE_FIELDS = ["engine", "primitive", "implementation", "prop_kind", "memory_descriptors", "attributes",
                    "auxiliary", "problem_desc", "exec_time"]
COLUMNS = ["line", "timestamp", "api", "engine", "kind", "impl", "isa", "prop", "direction", "data_type", "data_types",
           "src_layout", "wei_layout", "dst_layout", "mds", "attrs", "aux", "problem", "time_ms"]
MAX_EXAMPLES = 5
CONV_KEYS = re.compile(r"(mb|g|ic|oc|id|ih|iw|od|oh|ow|kd|kh|kw|sd|sh|sw|dd|dh|dw|pd|ph|pw)(\d+)")


@dataclass
class ParsedLog:
    """A parsed log: executed primitives, creation/dispatch lines, header facts, counts."""

    exec: pd.DataFrame
    creates: pd.DataFrame
    info: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    malformed_examples: list = field(default_factory=list)
    source: str = ""

    def require_primitives(self) -> None:
        """Raise the user error that says why a log without executed primitives is of no use."""
        if not self.exec.empty:
            return
        c = self.counts
        if c["lines"] == 0:
            why = "it is empty"
        elif c["other"] == c["lines"]:
            why = f"none of its {c['lines']} lines is a oneDNN verbose line, so it is not a verbose log"
        elif c.get("malformed"):  # exec lines there, none readable: a corrupt or edited log, not a quiet run
            example = f" (the first: {self.malformed_examples[0][:80]!r})" if self.malformed_examples else ""
            what = "is an executed primitive" if c["malformed"] == 1 else "are executed primitives"
            why = (f"{c['malformed']} of its {c['lines']} lines {what} that cannot be read"
                   f"{example}; the log is corrupt or was edited")
        else:
            why = (f"none of its {c['lines']} lines is an executed primitive; usually no op reached oneDNN "
                   "(fp32 GEMMs go to MKL), or verbose mode was off")
        raise CpuoptError(f"{self.source} holds no oneDNN primitive: {why}; capture one with "
                          "`cpuopt bench --onednn-verbose FILE`")

    def summary(self) -> str:
        c = self.counts
        text = (f"{self.source or 'log'}: {c['exec']} exec lines ({self.exec.time_ms.sum():.1f} ms), "
                f"{c['create']} create/dispatch, {c['info']} header, {c['other']} other program output, "
                f"{c['malformed']} malformed")
        if self.info.get("version"):
            text += f"; {self.info['version']}, {self.info.get('isa', 'ISA ?')}, threads {self.info.get('nthr', '?')}"
        return text


def parse_md(token: str) -> tuple[str, str, str]:
    """One memory descriptor -> (argument, data type, layout tag), for every format seen."""
    parts = token.split(":")
    head = parts[0]
    if len(parts) > 1 and parts[1] in DTYPES:  # oneDNN >= 3.x: src:f32:a:blocked:abcd::f0
        return head, parts[1], parts[4] if len(parts) > 4 else ""
    if "_" in head and head.rsplit("_", 1)[1] in DTYPES:  # DNNL 1.x-2.x: src_f32::blocked:abcd:f0
        arg, dtype = head.rsplit("_", 1)
        return arg, dtype, parts[3] if len(parts) > 3 else ""
    if len(parts) == 2:  # MKL-DNN 0.x: fsrc:nChw8c, or a reorder's in:f32_nchw
        dtype, _, layout = parts[1].partition("_")
        if dtype in DTYPES and layout:
            return head, dtype, layout
        return head[1:] if head[:1] in ("f", "d") else head, "", parts[1]
    return head, "", ""


def parse_conv(problem: str) -> dict | None:
    """A benchdnn convolution descriptor -> sizes, with benchdnn's defaults filled in."""
    p = {k: int(v) for k, v in CONV_KEYS.findall(problem.split("_n")[0] if '_n"' in problem else problem)}
    if "ic" not in p or "oc" not in p or not ({"ih", "iw"} & set(p)):
        return None
    dims = ["d", "h", "w"] if "id" in p else ["h", "w"]
    if "ih" not in p:
        p["ih"] = p["iw"]
    p.setdefault("iw", p["ih"])
    for d in dims:
        p.setdefault(f"k{d}", p.get("kh", 1))
        p.setdefault(f"s{d}", p.get("sh", 1))
        p.setdefault(f"d{d}", p.get("dh", 0))
        p.setdefault(f"p{d}", p.get("ph", 0))
        expected = (p[f"i{d}"] + 2 * p[f"p{d}"] - (p[f"d{d}"] + 1) * (p[f"k{d}"] - 1) - 1) // p[f"s{d}"] + 1
        p.setdefault(f"o{d}", expected)
        if p[f"o{d}"] != expected:
            return None  # asymmetric padding: not expressible as a plain PyTorch convolution
    p.setdefault("g", 1)
    p.setdefault("mb", 1)
    p["dims"] = dims
    return p


def conv_taps(p: dict, deconvolution: bool = False) -> int:
    """The kernel taps that fall on the input, summed over the output positions: a convolution's
    multiply-accumulates per (image, output channel, input channel of its group). Taps on padding
    are not work, as benchdnn counts a problem's ops (oneDNN's tests/benchdnn/conv/conv.cpp,
    ``prb_t::count_ops``); a deconvolution's output is its input there. ``p``: ``parse_conv``'s."""
    taps = 1
    for d in p["dims"]:
        outer, inner = (p[f"i{d}"], p[f"o{d}"]) if deconvolution else (p[f"o{d}"], p[f"i{d}"])
        taps *= axis_taps(inner, outer, p[f"k{d}"], p[f"s{d}"], p[f"p{d}"], p[f"d{d}"] + 1)
    return taps


def parse_dims(problem: str) -> list[list[int]]:
    """'4x16x8x8' -> [[4,16,8,8]]; matmul '2x3:3x4' -> [[2,3],[3,4]]."""
    return [[int(x) for x in part.split("x") if x.isdigit()] for part in problem.split(":")]


def _is_number(text: str) -> bool:
    """A finite number: a time of nan or inf is a malformed line, not a time."""
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


class _Parser:
    """Line-by-line state: the template seen so far, the columns, the counts."""

    def __init__(self):
        self.template: list[str] | None = None
        self.graph_template: list[str] | None = None
        # an executed line is its distinct fields (``unique``, index ``uids``), its number, timestamp and time
        self.unique: list[tuple] = []
        self.uids: list[int] = []
        self.numbers: list[int] = []
        self.timestamps: list[float | None] = []
        self.times: list[float] = []
        self.cache: dict[tuple, int] = {}  # parsed fields -> index in unique (-1: malformed)
        self.fast: dict[str, int] = {}  # a raw line but its time -> index in unique: parsed once
        self.creates = {c: [] for c in ("line", "operation", "kind", "impl", "prop", "problem", "time_ms")}
        self.info: dict = {}
        self.counts = {"exec": 0, "create": 0, "info": 0, "other": 0, "malformed": 0, "lines": 0}
        self.examples: list[str] = []

    def malformed(self, number: int, line: str) -> None:
        self.counts["malformed"] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"line {number}: {line[:160]}")

    def header(self, parts: list[str]) -> None:
        self.counts["info"] += 1
        text = ",".join(parts)
        if "template:" in parts[0]:  # template: (3.x) or prim_template: (2.x)
            names = [p.split("template:")[-1] for p in parts]
            names = [n for n in names if n not in ("timestamp", "operation")]
            if "partition_id" in names:  # the graph API has a template of its own
                self.graph_template = names
            else:
                self.template = names
            self.cache.clear()
            self.fast.clear()
        elif "isa:" in text:
            self.info["isa"] = text.split("isa:", 1)[1]
        elif "nthr:" in text:
            self.info["nthr"] = int(text.split("nthr:", 1)[1].split(",")[0])
        elif ("oneDNN v" in text or "oneDNN Graph v" in text or "DNNL v" in text or "MKL-DNN v" in text
              or "Intel MKL-DNN" in text) \
                and "version" not in self.info:
            self.info["version"] = text.split(" (")[0]

    def feed(self, number: int, line: str) -> None:
        self.counts["lines"] += 1
        head, _, tail = line.rpartition(",")
        uid = self.fast.get(head)
        if uid is not None:  # the same line as before but for its time: nothing to parse again
            try:
                time = float(tail)
            except ValueError:
                time = -1.0
            if 0 <= time < math.inf:  # a NaN fails both
                self.counts["exec"] += 1
                self.uids.append(uid)
                self.numbers.append(number)
                self.timestamps.append(None)
                self.times.append(time)
                return
        line = line.rstrip("\r\n")
        if not line.startswith(MARKERS):
            at = min((line.find(m) for m in MARKERS if m in line), default=-1)
            if at < 0:
                self.counts["other"] += 1
                return
            line = line[at:]  # program output glued in front of a verbose line
        parts = line.split(",")
        i = 2 if len(parts) > 1 and parts[1] in VERSION_MARKERS else 1
        timestamp = None
        api = "graph" if parts[0] == GRAPH_MARKER else "primitive"
        for _ in range(2):  # a timestamp and an API kind, in either order
            if i < len(parts) and parts[i] in API_KINDS:
                api, i = parts[i], i + 1
            elif i < len(parts) and parts[i][:1].isdigit() and _is_number(parts[i]):
                timestamp, i = float(parts[i]), i + 1
        if i >= len(parts):
            return self.malformed(number, line)
        op, rest = parts[i], parts[i + 1:]
        if op == "info":
            return self.header(rest)
        if op.startswith(("create", "compile")) or op in ("dispatch", "check", "error", "warn"):
            self.counts["create"] += 1
            if len(rest) >= 4:
                engine = rest[0] in ("cpu", "gpu")
                if api == "graph" and engine:  # engine, partition id, partition kind, op names, ..., backend, time
                    kind, impl, prop, problem = f"graph:{rest[2]}", rest[-2], "", rest[3]
                else:
                    kind, impl, prop = rest[1:4] if engine else rest[0:3]
                    problem = rest[-2] if len(rest) > 5 else ""
                for name, value in (("line", number), ("operation", op), ("kind", kind), ("impl", impl),
                                    ("prop", prop), ("problem", problem)):
                    self.creates[name].append(value)
                self.creates["time_ms"].append(float(rest[-1]) if _is_number(rest[-1]) else None)
            return
        if op != "exec" or not rest or not _is_number(rest[-1]) or float(rest[-1]) < 0:
            return self.malformed(number, line)  # also a truncated last line, and a time below zero
        uid = self.exec_line(number, timestamp, api, rest, line)
        if uid >= 0 and timestamp is None:
            self.fast[head] = uid

    def exec_line(self, number: int, timestamp, api: str, rest: list[str], line: str) -> int:
        """An executed primitive; identical lines (but for the time) are parsed once. Returns the
        index of its fields in ``unique``, -1 when malformed."""
        key = (api, ",".join(rest[:-1]), line[:1])
        uid = self.cache.get(key)
        if uid is None:
            fields = self.graph_fields(rest) if api == "graph" else self.primitive_fields(rest, line)
            uid = -1
            if fields:
                uid = len(self.unique)
                self.unique.append((api, *fields))
            self.cache[key] = uid
        if uid < 0:
            self.malformed(number, line)
            return uid
        self.counts["exec"] += 1
        self.uids.append(uid)
        self.numbers.append(number)
        self.timestamps.append(timestamp)
        self.times.append(float(rest[-1]))
        return uid

    def exec_frame(self) -> pd.DataFrame:
        """The executed lines as a table: the distinct fields taken by index, numbers and times added."""
        frame = pd.DataFrame.from_records(self.unique, columns=COLUMNS[2:-1]).take(
            np.asarray(self.uids, dtype=np.int64)).reset_index(drop=True)
        frame.insert(0, "line", np.asarray(self.numbers, dtype=np.int64))
        frame.insert(1, "timestamp", np.asarray(self.timestamps, dtype=float))
        frame["time_ms"] = np.asarray(self.times, dtype=float)
        return frame

    def graph_fields(self, rest: list[str]) -> tuple | None:
        """Graph API: engine, partition_id, partition_kind, op_names, ..., backend, exec_time."""
        if len(rest) < 5:
            return None
        names = self.graph_template if self.graph_template and len(self.graph_template) == len(rest) else \
            GRAPH_FIELDS
        f = dict(zip(names, rest))
        impl = f.get("implementation") or f.get("backend") or rest[-2]
        return (rest[0], f"graph:{f['partition_kind']}", impl, impl, "", "none", "", "", "", "", "",
                f.get("logical_tensors", ""), "", f.get("data_formats", ""), f["op_names"])

    def primitive_fields(self, rest: list[str], line: str) -> tuple | None:
        """engine, kind, impl, isa, prop, direction, data types, layouts, mds, attrs, aux, problem."""
        if rest[0] not in ("cpu", "gpu"):
            rest = ["cpu"] + rest  # MKL-DNN 0.x has no engine field
        if self.template and len(rest) == len(self.template):
            f = dict(zip(self.template, rest))
            kind, impl, prop, mds = f["primitive"], f["implementation"], f["prop_kind"], f["memory_descriptors"]
            attrs, aux, problem = f.get("attributes", ""), f.get("auxiliary", ""), f.get("problem_desc", "")
        elif len(rest) >= 8:  # engine, kind, impl, prop, mds, attrs..., aux, problem, time
            kind, impl, prop, mds = rest[1], rest[2], rest[3], rest[4]
            attrs, aux, problem = ",".join(rest[5:-3]), rest[-3], rest[-2]
        elif len(rest) >= 7 and line.startswith("mkldnn_verbose"):
            kind, impl, prop, mds, attrs, aux, problem = rest[1], rest[2], rest[3], rest[4], "", rest[-3], rest[-2]
        else:
            return None
        dtypes, layouts = [], {}
        for token in mds.split():
            arg, dtype, layout = parse_md(token)
            if dtype != "undef":
                if dtype:
                    dtypes.append(f"{arg}:{dtype}")
                layouts.setdefault(arg.replace("diff_", ""), layout)
        family, _, isa = impl.partition(":")
        return (rest[0], kind, impl, isa or family, prop, DIRECTIONS.get(prop, "none"),
                dtypes[0].split(":")[1] if dtypes else "", " ".join(dtypes),
                layouts.get("src", layouts.get("data", layouts.get("in", ""))), layouts.get("wei", ""),
                layouts.get("dst", layouts.get("out", "")), mds, attrs.strip(), aux, problem)


def _lines(source) -> tuple[Iterable[str], str]:
    if isinstance(source, (str, os.PathLike)) and "\n" not in str(source):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise CpuoptError(f"log file {path} does not exist; capture one with "
                              "`cpuopt bench --onednn-verbose FILE` or ONEDNN_VERBOSE=1")
        if os.path.isdir(path):
            logs = sorted(n for n in os.listdir(path) if n.endswith(".log"))
            example = os.path.join(path, logs[0]) if logs else os.path.join(path, "FILE.log")
            raise CpuoptError(f"{path} is a folder, not a log; name one log file in it, e.g. {example}")
        try:
            return open(path, encoding="utf-8", errors="replace"), path
        except OSError as exc:
            raise CpuoptError(f"cannot read log file {path}: {exc.strerror}; check its permissions") from exc
    if isinstance(source, str):
        return io.StringIO(source), "text"
    return source, getattr(source, "name", "stream")


def parse_log(source) -> ParsedLog:
    """Parse a oneDNN verbose log (a path, the text itself, or an iterable of lines)."""
    lines, name = _lines(source)
    parser = _Parser()
    try:
        for number, line in enumerate(lines, 1):
            parser.feed(number, line)
    finally:
        if hasattr(lines, "close"):
            lines.close()
    exec_df = parser.exec_frame()
    info = dict(parser.info, template=parser.template)
    return ParsedLog(exec_df, pd.DataFrame(parser.creates), info, parser.counts, parser.examples, name)
