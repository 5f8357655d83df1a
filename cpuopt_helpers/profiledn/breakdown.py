"""Where the time goes: breakdowns of a parsed log, and comparisons of two logs; what they say as
``decisions.Finding`` records (worded by ``cpuopt_helpers.wording``)."""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers.decisions import Finding
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.profiledn.parse import parse_conv, parse_dims

GROUPINGS = {
    "kind": ["kind"],
    "direction": ["direction"],
    "kind_direction": ["kind", "direction"],
    "impl": ["kind", "impl"],
    "isa": ["isa"],
    "shape": ["kind", "direction", "problem"],
}
PRIMITIVE_KEY = ["kind", "direction", "data_type", "src_layout", "wei_layout", "dst_layout", "problem"]
SHARE_MOVED = 0.05  # a share that moved by more than 5 points is worth a sentence
REORDER_ROLES = ("weights", "activations", "other")  # what a reorder moves (``reorder_roles``)
STAGE = "profiling"  # ProfileDNN's findings are stage 02's (stages/profiling.py), where no caller names another


def _group_columns(by: str) -> list[str]:
    if by not in GROUPINGS:
        raise CpuoptError(f"unknown breakdown {by!r}; use one of {', '.join(GROUPINGS)}")
    return GROUPINGS[by]


def breakdown(df: pd.DataFrame, by: str = "kind", steps: int | None = None) -> pd.DataFrame:
    """Calls, total time, share of logged time and (given the step count) per-step time."""
    cols = _group_columns(by)
    if df.empty:
        return pd.DataFrame(columns=cols + ["calls", "time_ms", "share"]).set_index(cols)
    out = df.groupby(cols, sort=False)["time_ms"].agg(calls="count", time_ms="sum")
    out["share"] = out["time_ms"] / out["time_ms"].sum()
    out["mean_ms"] = out["time_ms"] / out["calls"]
    if steps:
        out["ms_per_step"] = out["time_ms"] / steps
        out["calls_per_step"] = out["calls"] / steps
    return out.sort_values("time_ms", ascending=False)


def distinct_primitives(df: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct primitive (kind, direction, type, layouts, shape): calls and time."""
    if df.empty:
        return pd.DataFrame(columns=PRIMITIVE_KEY + ["impl", "calls", "time_ms", "mean_ms"])
    out = (df.groupby(PRIMITIVE_KEY, sort=False)
           .agg(impl=("impl", "first"), calls=("time_ms", "count"), time_ms=("time_ms", "sum"))
           .reset_index())
    out["mean_ms"] = out["time_ms"] / out["calls"]
    return out.sort_values("time_ms", ascending=False).reset_index(drop=True)


def conv_tensor_dims(df: pd.DataFrame) -> tuple[set, set]:
    """The dims of the weights (and biases) and of the activations of a log's convolutions, as a
    reorder's problem prints them: ``(oc, ic, kh, kw)``, grouped ``(g, oc/g, ic/g, kh, kw)``;
    ``(mb, c, h, w)``."""
    weights, activations = set(), set()
    for problem in df.loc[df["kind"].isin(["convolution", "deconvolution"]), "problem"].unique():
        p = parse_conv(str(problem))
        if p is None:
            continue
        kernel, g = [p[f"k{d}"] for d in p["dims"]], p["g"]
        weights |= {(p["oc"],), (p["oc"], p["ic"], *kernel) if g == 1 else (g, p["oc"] // g, p["ic"] // g, *kernel)}
        activations |= {(p["mb"], p["ic"], *[p[f"i{d}"] for d in p["dims"]]),
                        (p["mb"], p["oc"], *[p[f"o{d}"] for d in p["dims"]])}
    return weights, activations


def reorder_roles(df: pd.DataFrame) -> dict[str, list]:
    """What a log's reorders move, ``{role: [calls, ms]}`` for weights, activations and other: each
    reorder's dims matched against the log's convolutions (``conv_tensor_dims``). Dims that fit
    both, or neither, are other."""
    weights, activations = conv_tensor_dims(df)
    out = {role: [0, 0.0] for role in REORDER_ROLES}
    for problem, group in df[df["kind"] == "reorder"].groupby("problem"):
        dims = tuple(next(iter(parse_dims(str(problem))), []))
        role = ("weights" if dims in weights and dims not in activations else
                "activations" if dims in activations and dims not in weights else "other")
        out[role][0] += len(group)
        out[role][1] += float(group["time_ms"].sum())
    return out


def findings(df: pd.DataFrame, steps: int | None = None, label: str = "") -> list[Finding]:
    """What one log says: the top kinds and directions, the reorder overhead, reference kernels
    (``label``: the profile's, said before each sentence where given)."""
    if df.empty:
        return [Finding(label, STAGE, "log empty")]
    total = df["time_ms"].sum()
    kinds = breakdown(df, "kind")
    found = [Finding(label, STAGE, "log total", {
        "executions": len(df), "total_ms": float(total), "steps": steps,
        "kinds": [[k, float(r.share)] for k, r in kinds.head(4).iterrows()]})]
    found.append(Finding(label, STAGE, "log directions", {"steps": steps, "directions": [
        [d, float(r.share), int(r.calls)] for d, r in breakdown(df, "direction").iterrows()]}))
    if "reorder" in kinds.index:
        roles = {role: ms / total for role, (calls, ms) in reorder_roles(df).items() if calls}
        found.append(Finding(label, STAGE, "log reorders", {"share": float(kinds.loc["reorder"].share), "steps": steps,
                                                            "calls": int(kinds.loc["reorder"].calls), "roles": roles}))
    slow = df[df["isa"].isin(["any", "ref"]) | df["impl"].str.startswith("ref")]
    if len(slow):
        found.append(Finding(label, STAGE, "log reference kernels", {"executions": len(slow), "kinds": sorted(
            set(slow["kind"])), "share": float(slow["time_ms"].sum() / total)}))
    return found


def compare(a: pd.DataFrame, b: pd.DataFrame, by: str = "kind_direction",
            labels: tuple[str, str] = ("A", "B"), steps: tuple[int | None, int | None] = (None, None)) -> pd.DataFrame:
    """Two logs side by side: calls, time and shares per group, and the moved share."""
    ba, bb = breakdown(a, by, steps[0]), breakdown(b, by, steps[1])
    la, lb = labels
    out = pd.DataFrame({f"calls_{la}": ba["calls"], f"calls_{lb}": bb["calls"],
                        f"time_ms_{la}": ba["time_ms"], f"time_ms_{lb}": bb["time_ms"],
                        f"share_{la}": ba["share"], f"share_{lb}": bb["share"]})
    out = out.fillna(0)
    for col in (f"calls_{la}", f"calls_{lb}"):
        out[col] = out[col].astype(int)
    out["share_moved"] = out[f"share_{lb}"] - out[f"share_{la}"]
    if steps[0] and steps[1]:
        out[f"calls_per_step_{la}"] = out[f"calls_{la}"] / steps[0]
        out[f"calls_per_step_{lb}"] = out[f"calls_{lb}"] / steps[1]
    return out.sort_values(f"time_ms_{la}", ascending=False)


def compare_findings(a: pd.DataFrame, b: pd.DataFrame, labels: tuple[str, str] = ("A", "B"),
                     steps: tuple[int | None, int | None] = (None, None), workload: str = "",
                     stage: str = STAGE) -> list[Finding]:
    """The differences of two logs: kernels in one run only, call counts and shares that moved
    (``workload``: whose logs, kept on the records; ``stage``: the notebook's that tells them)."""
    la, lb = labels

    def said(kind: str, **values) -> Finding:
        return Finding(workload, stage, kind, values)

    ta, tb = float(a["time_ms"].sum()), float(b["time_ms"].sum())
    per_step = bool(steps[0] and steps[1])
    found = [said("logs onednn time", labels=[la, lb], per_step=per_step,
                  ms=[ta / steps[0], tb / steps[1]] if per_step else [ta, tb])]
    for (kind, direction), row in compare(a, b, "kind_direction", labels, steps).iterrows():
        ca, cb = int(row[f"calls_{la}"]), int(row[f"calls_{lb}"])
        if ca == 0 or cb == 0:
            found.append(said("logs one run only", primitive=kind, direction=direction,
                              only_in=lb if ca == 0 else la, calls=max(ca, cb)))
        elif ca != cb and (not steps[0] or ca / steps[0] != cb / steps[1]):
            found.append(said("logs calls", primitive=kind, direction=direction, calls=[ca, cb]))
        if abs(row["share_moved"]) >= SHARE_MOVED:
            found.append(said("logs share moved", primitive=kind, direction=direction,
                              shares=[float(row[f"share_{la}"]), float(row[f"share_{lb}"])]))
    impl_a, impl_b = breakdown(a, "impl"), breakdown(b, "impl")
    if len(impl_a) and len(impl_b) and impl_a.index[0] != impl_b.index[0]:
        name = lambda key: " ".join(key) if isinstance(key, tuple) else key  # noqa: E731  (kind, impl)
        found.append(said("logs heaviest implementation", labels=[la, lb],
                          implementations=[name(impl_a.index[0]), name(impl_b.index[0])],
                          shares=[float(impl_a["share"].iloc[0]), float(impl_b["share"].iloc[0])]))
    ka = set(map(tuple, distinct_primitives(a)[PRIMITIVE_KEY].values.tolist()))
    kb = set(map(tuple, distinct_primitives(b)[PRIMITIVE_KEY].values.tolist()))
    found.append(said("logs distinct primitives", labels=[la, lb], distinct=[len(ka), len(kb)], both=len(ka & kb)))
    return found
