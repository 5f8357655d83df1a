"""The rounds of every A/B comparison in a results store, each with its runs' placement (``results.apart``),
and the spread of the log ratios over all rounds against the rounds whose two runs sat alike: the record
behind docs/measuring.md's "Rounds left out". Prints markdown.

python data/vcpu_placement/rounds.py STORE (a build/results.sqlite, opened read-only)."""

import json
import math
import sqlite3
import statistics
import subprocess
import sys
from datetime import date

from cpuopt_helpers.results import apart

store = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
rows = store.execute("SELECT sweep, arm, round, result, machine FROM results WHERE status = 'ok' ORDER BY id").fetchall()
kinds = dict(store.execute("SELECT id, kind FROM sweeps").fetchall())
runs: dict[str, dict] = {}
for sweep, arm, round_, result, _ in rows:
    if kinds.get(sweep) == "ab":
        runs.setdefault(sweep, {})[(round_, arm)] = json.loads(result)  # a round measured again: its latest runs
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
machine = rows[-1][4] if rows else None
print(f"# Rounds of A/B comparisons and their runs' placement, {date.today()}, {machine}, commit {commit}\n")
for sweep, by in runs.items():
    keys = sorted({i for i, arm in by if (i, 0) in by and (i, 1) in by})
    flags = apart([r.get("machine_state") or {} for r in by.values()])
    flag = dict(zip(by, flags))
    label = f"{by[(keys[0], 1)]['label']} over {by[(keys[0], 0)]['label']}" if keys else sweep
    print(f"## {label}\n\n| round | a samples/s | b samples/s | b/a | a apart | b apart |\n|---|---|---|---|---|---|")
    logs, alike = [], []
    for i in keys:
        a, b = by[(i, 0)]["samples_per_s"], by[(i, 1)]["samples_per_s"]
        fa, fb = flag[(i, 0)], flag[(i, 1)]
        logs.append(math.log(b / a))
        if fa is None or fb is None or fa == fb:
            alike.append(math.log(b / a))
        print(f"| {i} | {a:.3f} | {b:.3f} | {b / a:.3f} | {fa} | {fb} |")
    sd = (lambda xs: f"{statistics.stdev(xs):.3f}" if len(xs) > 1 else "n/a")
    print(f"\nStandard deviation of log(b/a): all {len(logs)} rounds {sd(logs)}; the {len(alike)} whose runs sat "
          f"alike (or unprobed) {sd(alike)}.\n")
