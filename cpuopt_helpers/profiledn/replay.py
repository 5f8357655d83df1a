"""Projection: replay each distinct primitive in isolation, sum time x calls, compare.

The paper's ProfileDNN re-runs each primitive with benchdnn; here each one is re-run with
the PyTorch call that reaches the same oneDNN primitive (same shape, data type, layout and
direction), in a fresh process pinned to the same cores with the same thread count, and
the median of several repeats is kept. A PyTorch call is more than its primitive (dispatch,
output allocation, reorders of plain tensors into the primitive's layout), so each replay
is also run with oneDNN's verbose log on, and the primitive's own time is read from that
log (the same kind, direction, type, layouts and shape as the logged row): like for like
with the logged time. That time is the replayed time where found; the call's wall time
otherwise. The efficiency ratio is

    (kernel-only time per step) / (measured step time)

and the kernel-only time is the projected step time if everything outside oneDNN (Python,
framework dispatch, non-oneDNN operators) vanished. Primitives it cannot replay are listed
and counted at their logged time.

| primitive            | replayed with                                             |
|----------------------|-----------------------------------------------------------|
| convolution (2D/3D)  | ``conv2d``/``conv3d`` forward; ``aten.convolution_backward`` with the data or weights mask |
| inner_product        | ``linear`` forward; the matching matmul for backward data/weights |
| matmul               | ``torch.matmul`` with the logged shapes                   |
| reorder              | a copy of the same number of elements (same bytes moved)  |
| anything else        | not replayed: counted at its logged time                  |
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import sys
import tempfile

import pandas as pd

from cpuopt_helpers.decisions import Finding
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.profiledn.breakdown import PRIMITIVE_KEY, STAGE, distinct_primitives
from cpuopt_helpers.profiledn.parse import parse_conv, parse_dims, parse_log
from cpuopt_helpers.stats import time_calls

CHANNELS_LAST = {"acdb", "acdeb"}
TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def _runner(row) -> tuple[object | None, str]:
    """A zero-argument function that runs the primitive once, or (None, why not)."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, TORCH_DTYPES.get(row.data_type or "f32", "float32"), None)
    if row.data_type and row.data_type not in TORCH_DTYPES:
        return None, f"data type {row.data_type} not replayed"
    if row.kind == "convolution":
        p = parse_conv(row.problem)
        if p is None:
            return None, "convolution descriptor not understood (or asymmetric padding)"
        dims = p["dims"]
        x = torch.randn(p["mb"], p["ic"], *[p[f"i{d}"] for d in dims], dtype=dtype)
        w = torch.randn(p["oc"], p["ic"] // p["g"], *[p[f"k{d}"] for d in dims], dtype=dtype)
        gy = torch.randn(p["mb"], p["oc"], *[p[f"o{d}"] for d in dims], dtype=dtype)
        if row.src_layout in CHANNELS_LAST:
            fmt = torch.channels_last if len(dims) == 2 else torch.channels_last_3d
            x, w, gy = (t.contiguous(memory_format=fmt) for t in (x, w, gy))
        stride = [p[f"s{d}"] for d in dims]
        pad = [p[f"p{d}"] for d in dims]
        dil = [p[f"d{d}"] + 1 for d in dims]  # oneDNN counts dilation from 0
        conv = F.conv2d if len(dims) == 2 else F.conv3d
        if row.direction == "forward":
            return (lambda: conv(x, w, None, stride, pad, dil, p["g"])), ""
        mask = [True, False, False] if row.direction == "backward_data" else [False, True, False]
        return (lambda: torch.ops.aten.convolution_backward(gy, x, w, None, stride, pad, dil, False,
                                                            [0] * len(dims), p["g"], mask)), ""
    if row.kind == "reorder":
        (shape, *_) = parse_dims(row.problem)
        src = torch.randn(*shape, dtype=dtype)
        dst = torch.empty_like(src)
        return (lambda: dst.copy_(src)), "replayed as a same-size copy"
    if row.kind == "matmul":
        shapes = parse_dims(row.problem)
        if len(shapes) < 2:
            return None, "matmul descriptor not understood"
        a, b = torch.randn(*shapes[0], dtype=dtype), torch.randn(*shapes[1], dtype=dtype)
        return (lambda: torch.matmul(a, b)), ""
    if row.kind == "inner_product":
        p = {k: int(v) for k, v in re.findall(r"(mb|ic|oc|ih|iw|id)(\d+)", row.problem)}
        if not {"mb", "ic", "oc"} <= set(p):
            return None, "inner product descriptor not understood"
        k = p["ic"] * p.get("ih", 1) * p.get("iw", p.get("ih", 1)) * p.get("id", 1)
        x, w = torch.randn(p["mb"], k, dtype=dtype), torch.randn(p["oc"], k, dtype=dtype)
        gy = torch.randn(p["mb"], p["oc"], dtype=dtype)
        fn = {"forward": lambda: F.linear(x, w), "backward_data": lambda: gy @ w,
              "backward_weights": lambda: gy.t() @ x}.get(row.direction)
        return (fn, "") if fn else (None, f"direction {row.direction} not replayed")
    return None, f"{row.kind} is not replayed"


def logged_calls(fn, calls: int) -> str:
    """Call ``fn`` ``calls`` times with oneDNN's verbose log on: the log text it printed (this
    process's standard output is caught at the file descriptor, where oneDNN writes)."""
    import ctypes

    import torch

    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                for _ in range(calls):
                    fn()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        caught.seek(0)
        return caught.read().decode(errors="replace")


def kernel_time(row, text: str, repeats: int, calls: int) -> tuple[float | None, float, int]:
    """From the replay's own log of ``calls`` PyTorch calls: the median time of the replayed
    primitive itself (the primitive with the logged row's kind, direction, type, layouts and
    shape, over its last ``repeats`` executions; where this CPU blocks the layouts otherwise, the
    one with the same kind, direction, type and shape), and the time per call and count of the other
    primitives the calls ran around it (reorders of inputs and outputs, which the training
    step may not pay)."""
    df = parse_log(io.StringIO(text)).exec if text.strip() else pd.DataFrame(columns=PRIMITIVE_KEY + ["time_ms"])
    if df.empty:
        return None, 0.0, 0
    def matching(keys: list[str]) -> pd.Series:
        return (df[keys].astype(str) == pd.Series({k: str(getattr(row, k)) for k in keys})).all(axis=1)

    same = matching(PRIMITIVE_KEY)
    if not same.any():  # a log from a CPU of another width (AVX-512's 16-wide blocked layouts, AVX2's 8-wide)
        same = matching([k for k in PRIMITIVE_KEY if not k.endswith("_layout")])
    mine, others = df[same], df[~same]
    kernel = statistics.median(mine["time_ms"].tail(repeats)) if len(mine) else None
    return kernel, others["time_ms"].sum() / max(1, calls), len(others)


def time_primitives(prims: pd.DataFrame, repeats: int = 10, warmup: int = 2) -> list[dict]:
    """Inside the pinned process: each replayable primitive's median wall time per PyTorch call
    (``replay_ms``), then, in as many calls again with oneDNN's verbose log on, the time of the
    primitive itself (``kernel_replay_ms``: like for like with the logged time, the first
    creation and the warm-up calls excluded) and of what else the call ran in oneDNN
    (``added_ms`` per call)."""
    import torch

    out = []
    with torch.no_grad():
        for row in prims.itertuples():
            fn, note = _runner(row)
            if fn is None:
                out.append({"replayed": False, "replay_ms": None, "kernel_replay_ms": None, "added_ms": None,
                            "note": note})
                continue
            times = time_calls(fn, repeats, warmup)
            kernel, added, _ = kernel_time(row, logged_calls(fn, warmup + repeats), repeats, warmup + repeats)
            out.append({"replayed": True, "replay_ms": statistics.median(times) * 1e3, "kernel_replay_ms": kernel,
                        "added_ms": added, "note": note})
    return out


def projection(prims: pd.DataFrame, replays: list[dict], steps: int, step_ms: float | None) -> dict:
    """Sum replayed time x calls (logged time where not replayed) into the efficiency ratio.

    A primitive's replayed time is its own time in the replay's log (``kernel_replay_ms``, like
    for like with the logged time) where the replay found it there, else the PyTorch call's
    wall time (``replay_ms``, which also holds the call's dispatch and any reorders it adds).
    ``agreement`` is replayed over logged time, over the primitives replayed like for like."""
    table = pd.concat([prims.reset_index(drop=True), pd.DataFrame(replays)], axis=1)
    for column in ("kernel_replay_ms", "added_ms"):
        if column not in table:  # replays from before the replay read its own log
            table[column] = None
    table["kernel_replay_ms"] = pd.to_numeric(table["kernel_replay_ms"], errors="coerce")
    table["replay_ms"] = pd.to_numeric(table["replay_ms"], errors="coerce")
    replayed = table["kernel_replay_ms"].fillna(table["replay_ms"])
    table["kernel_ms"] = replayed.where(table["replayed"], table["mean_ms"]) * table["calls"]
    table["replay_over_logged"] = table["kernel_replay_ms"] / table["mean_ms"]
    kernel_per_step = table["kernel_ms"].sum() / steps
    logged_per_step = table["time_ms"].sum() / steps
    missing = table[~table["replayed"]]
    alike = table[table["kernel_replay_ms"].notna()]
    wall = table[table["replayed"]]
    return {
        "table": table,
        "steps": steps,
        "kernel_ms_per_step": kernel_per_step,
        "logged_ms_per_step": logged_per_step,
        "alike": len(alike),
        "alike_logged_ms_per_step": alike["time_ms"].sum() / steps,
        "alike_replayed_ms_per_step": (alike["kernel_replay_ms"] * alike["calls"]).sum() / steps,
        "agreement": ((alike["kernel_replay_ms"] * alike["calls"]).sum() / alike["time_ms"].sum()
                      if len(alike) and alike["time_ms"].sum() else None),
        "call_replayed_ms_per_step": (wall["replay_ms"] * wall["calls"]).sum() / steps,
        "call_logged_ms_per_step": wall["time_ms"].sum() / steps,
        "step_ms": step_ms,
        "efficiency": kernel_per_step / step_ms if step_ms else None,
        "projected_step_ms": kernel_per_step,
        "replayed": int(table["replayed"].sum()),
        "not_replayed": int((~table["replayed"]).sum()),
        "not_replayed_ms_per_step": missing["time_ms"].sum() / steps,
        "not_replayed_kinds": sorted(set(missing["kind"])),
    }


def log_meta(log: str, needed: tuple[str, ...] = ()) -> dict:
    """What `cpuopt bench --onednn-verbose` recorded beside the log, its well-formed fields only: steps,
    threads (positive integers), cores (CPU numbers); {} where there is no such file. A field in
    ``needed`` (what the caller was not given otherwise) that the file holds in another form, or a
    file that is no such record, is said in one line, never guessed at."""
    try:
        with open(f"{log}.meta.json") as f:
            meta = json.load(f)
    except OSError:
        return {}
    except ValueError:
        meta = None
    meta = meta if isinstance(meta, dict) else {key: None for key in needed}
    checks = {"steps": lambda v: type(v) is int and v > 0, "threads": lambda v: type(v) is int and v > 0,
              "cores": lambda v: isinstance(v, list) and all(type(c) is int and c >= 0 for c in v)}
    good = {k: v for k, v in meta.items() if k not in checks or checks[k](v)}
    bad = [k for k in needed if k in meta and k not in good]
    if bad:
        flags = " and ".join(f"--{k}" for k in bad if k != "cores") or "--threads"
        raise CpuoptError(f"{log}.meta.json is not what `cpuopt bench --onednn-verbose` writes beside a log (its "
                          f"{', '.join(bad)}): give {flags} yourself, or remove it and capture the log again")
    return good


def replay_log(log: str, threads: int, cores: list[int] | None = None, repeats: int = 10,
               timeout_s: float = 600) -> list[dict]:
    """Replay a log's distinct primitives in a fresh process with the given threads and cores."""
    from cpuopt_helpers.runtimes import run_json_module

    return run_json_module("cpuopt_helpers.profiledn.replay", [log, "--repeats", str(repeats)], f"replay of {log}",
                           threads=threads, cores=cores, timeout_s=timeout_s)


def project_log(log: str, steps: int, step_ms: float | None, threads: int, cores: list[int] | None = None,
                repeats: int = 10) -> dict:
    """Parse, replay on the same cores and threads, and project: the whole stage in one call."""
    prims = distinct_primitives(parse_log(log).exec)
    return projection(prims, replay_log(log, threads, cores, repeats), steps, step_ms)


def projection_findings(proj: dict, label: str = "") -> list[Finding]:
    """What one projection says, from its numbers (``label``: the profile's, said before each sentence)."""
    found = [Finding(label, STAGE, "projection kernels", {
        "kernel_ms_per_step": float(proj["kernel_ms_per_step"]), "replayed": int(proj["replayed"]),
        "not_replayed": int(proj["not_replayed"])})]
    if proj.get("agreement") is not None:
        found.append(Finding(label, STAGE, "projection against log", {"alike": int(proj["alike"]), **{
            k: float(proj[k]) for k in ("alike_replayed_ms_per_step", "alike_logged_ms_per_step", "agreement",
                                        "call_replayed_ms_per_step", "call_logged_ms_per_step")}}))
    if proj["step_ms"]:
        agreement = proj.get("agreement")  # how far replay strays from the log, like for like: the ratio's trust
        found.append(Finding(label, STAGE, "projection efficiency", {
            "step_ms": float(proj["step_ms"]), "efficiency": float(proj["efficiency"]),
            "agreement": float(agreement) if agreement is not None else None}))
    if proj["not_replayed_kinds"]:
        found.append(Finding(label, STAGE, "projection not replayed", {
            "kinds": list(proj["not_replayed_kinds"]), "ms_per_step": float(proj["not_replayed_ms_per_step"])}))
    return found


def main(argv: list[str] | None = None) -> int:
    from cpuopt_helpers.worker import pin_to_cores

    parser = argparse.ArgumentParser(description="replay a oneDNN log's distinct primitives in this process")
    parser.add_argument("log")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    pin_to_cores()
    prims = distinct_primitives(parse_log(args.log).exec)
    print(json.dumps(time_primitives(prims, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
