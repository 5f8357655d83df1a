"""Stage 02, profiling (ProfileDNN): where does the step's time go in oneDNN, and how fast
could its kernels run? The capture and projection live in profiledn/; this is what the
notebook words from them.
"""

from __future__ import annotations

import pandas as pd


def slow_kernels(df: pd.DataFrame, top: int = 5) -> list[str]:
    """The implementations that take the most oneDNN time, with their ISA: names the slow kernels."""
    if df.empty:
        return ["No oneDNN primitive ran."]
    by_impl = df.groupby(["kind", "impl"])["time_ms"].agg(["sum", "count"]).sort_values("sum", ascending=False)
    total = by_impl["sum"].sum()
    return ["Slowest kernels: " + "; ".join(f"{kind} {impl} {row['sum'] / total:.0%} ({int(row['count'])} calls)"
                                            for (kind, impl), row in by_impl.head(top).iterrows()) + "."]
