"""Where the time goes: breakdowns of a parsed log, and comparisons of two logs."""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers.errors import CpuoptError

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


def findings(df: pd.DataFrame, steps: int | None = None) -> list[str]:
    """Sentences about one log: the top kinds and directions, and the reorder overhead."""
    if df.empty:
        return ["The log holds no executed primitive."]
    total = df["time_ms"].sum()
    per = f" ({total / steps:.2f} ms per step over {steps} steps)" if steps else ""
    kinds = breakdown(df, "kind")
    lines = [f"{len(df)} primitive executions took {total:.1f} ms{per}; "
             + ", ".join(f"{k} {r.share:.0%}" for k, r in kinds.head(4).iterrows()) + "."]
    dirs = breakdown(df, "direction")
    lines.append("By direction: " + ", ".join(f"{d.replace('_', ' ')} {r.share:.0%} ({int(r.calls)} calls)"
                                               for d, r in dirs.iterrows()) + ".")
    reorder = kinds.loc["reorder"] if "reorder" in kinds.index else None
    if reorder is not None:
        hint = "; a consistent layout (channels-last for CNNs) may remove many of them" if reorder.share > 0.1 else ""
        lines.append(f"Reorders (layout conversions, no useful compute) take {reorder.share:.0%} of oneDNN time "
                     f"in {int(reorder.calls)} calls{hint}.")
    slow = df[df["isa"].isin(["any", "ref"]) | df["impl"].str.startswith("ref")]
    if len(slow):
        share = slow["time_ms"].sum() / total
        kinds_slow = ", ".join(sorted(set(slow["kind"])))
        lines.append(f"Reference (unoptimised) implementations run {len(slow)} times ({share:.0%} of the time): "
                     f"{kinds_slow}.")
    return lines


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
                     steps: tuple[int | None, int | None] = (None, None)) -> list[str]:
    """Worded differences: kernels in one run only, call counts and shares that moved."""
    la, lb = labels
    table = compare(a, b, "kind_direction", labels, steps)
    lines = []
    ta, tb = a["time_ms"].sum(), b["time_ms"].sum()
    if steps[0] and steps[1]:
        ta, tb = ta / steps[0], tb / steps[1]
        lines.append(f"oneDNN time per step: {ta:.2f} ms in {la} vs {tb:.2f} ms in {lb} ({tb / ta:.2f}x)."
                     if ta else f"{la} logged no oneDNN time.")
    else:
        lines.append(f"Logged oneDNN time: {ta:.1f} ms in {la} vs {tb:.1f} ms in {lb}.")
    for (kind, direction), row in table.iterrows():
        name = f"{direction.replace('_', ' ')} {kind}" if direction != "none" else kind
        ca, cb = int(row[f"calls_{la}"]), int(row[f"calls_{lb}"])
        if ca == 0 or cb == 0:
            lines.append(f"{name} runs only in {lb if ca == 0 else la} ({max(ca, cb)} calls).")
        elif ca != cb and (not steps[0] or ca / steps[0] != cb / steps[1]):
            lines.append(f"{name}: {ca} calls vs {cb}.")
        if abs(row["share_moved"]) >= SHARE_MOVED:
            lines.append(f"{name}: share of oneDNN time {row[f'share_{la}']:.0%} -> {row[f'share_{lb}']:.0%}.")
    impl_a, impl_b = breakdown(a, "impl"), breakdown(b, "impl")
    if len(impl_a) and len(impl_b) and impl_a.index[0] != impl_b.index[0]:
        name = lambda key: " ".join(key) if isinstance(key, tuple) else key  # noqa: E731  (kind, impl)
        lines.append(f"The heaviest implementation changed: {name(impl_a.index[0])} ({impl_a['share'].iloc[0]:.0%} "
                     f"of oneDNN time) in {la}, {name(impl_b.index[0])} ({impl_b['share'].iloc[0]:.0%}) in {lb}.")
    ka = set(map(tuple, distinct_primitives(a)[PRIMITIVE_KEY].values.tolist()))
    kb = set(map(tuple, distinct_primitives(b)[PRIMITIVE_KEY].values.tolist()))
    lines.append(f"Distinct primitives: {len(ka)} in {la}, {len(kb)} in {lb}, {len(ka & kb)} in both.")
    return lines
