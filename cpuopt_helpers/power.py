"""What the comparison rule can find, by simulation: the numbers of the docs' measuring page.

The simulated machine is the one ``tests/test_compare.py`` tests the rule on: a run's throughput
is log-normal around its arm's speed (``SIGMA`` a run), and the whole machine's speed drifts from
round to round (``DRIFT``, shared by every arm of a round). Through the project's own functions
(``compare.paired_ratio`` ranks a screening, ``compare.run_adaptive`` confirms its winner,
``compare.pays`` hands it on) it answers two questions per preset's design:

- the power of one confirmation: how often it calls a true gain of ``GAIN`` faster;
- the chance that a true gain among ``CANDIDATES`` settings (the others doing nothing) is
  handed on after screening and confirmation, as a notebook's stage runs them, and that a
  setting is handed on where none of them pays (the stage's false hand-on).

The confirmations run without a budget: a budget spent before the minimum rounds ends in "too
few rounds", which hands nothing on.

``python -m cpuopt_helpers.power --write docs/measuring.md`` writes them between the page's
``<!-- power:start -->`` and ``<!-- power:end -->`` markers (``make docs`` does); seeded, so a
test can recompute them exactly.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
from pathlib import Path

from cpuopt_helpers import compare

SIGMA = 0.10  # log-normal noise of one run's throughput
DRIFT = 0.30  # the machine's speed from round to round (log-normal), shared by the round's runs
GAIN = 1.15
CANDIDATES = 5
TRIALS = 1000
# (name, screening rounds, confirmation's min and max rounds): make run's standard preset and the full one
DESIGNS = (("standard", 1, compare.FIXED_ROUNDS, compare.FIXED_ROUNDS),
           ("full", 2, compare.MIN_ROUNDS, compare.MAX_ROUNDS))


def machine(speeds: dict[str, float], rng: random.Random):
    """measure(arm, round) -> samples/s on the simulated machine, for arms of the given speeds."""
    level: dict[int, float] = {}

    def measure(arm: str, i: int) -> float:
        if i not in level:
            level[i] = rng.gauss(0, DRIFT)
        return 40.0 * speeds[arm] * math.exp(level[i] + rng.gauss(0, SIGMA))
    return measure


def confirmation_power(design: tuple, gain: float = GAIN, trials: int = TRIALS, seed: int = 0) -> float:
    """How often one confirmation of the design calls a true ``gain`` faster."""
    _, _, low, high = design
    rng = random.Random(seed)
    verdicts = [compare.run_adaptive(machine({"a": 1.0, "b": gain}, rng), min_rounds=low, max_rounds=high,
                                     seed=k)["verdict"] for k in range(trials)]
    return sum(v == "faster" for v in verdicts) / trials


def stage(design: tuple, gain: float, candidates: int, rng: random.Random, seed: int) -> str | None:
    """One stage: screen the base and ``candidates`` settings (the first truly ``gain`` faster), confirm
    the best-ranked against the base; the name of the setting handed on, or None."""
    _, screen_rounds, low, high = design
    speeds = {"base": 1.0} | {f"s{i}": gain if i == 0 else 1.0 for i in range(candidates)}
    measure = machine(speeds, rng)
    rounds = [{arm: measure(arm, i) for arm in speeds} for i in range(screen_rounds)]
    ranked = {arm: compare.paired_ratio([r["base"] for r in rounds], [r[arm] for r in rounds])["ratio"]
              for arm in speeds if arm != "base"}
    best = max(ranked, key=ranked.get)
    if ranked[best] <= 1.0:  # the screening gate of stages.choosing.choose
        return None
    confirm = machine({"a": 1.0, "b": speeds[best]}, rng)
    return best if compare.pays(compare.run_adaptive(confirm, min_rounds=low, max_rounds=high, seed=seed)) else None


def hand_on(design: tuple, gain: float = GAIN, candidates: int = CANDIDATES, trials: int = TRIALS,
            seed: int = 0) -> dict:
    """How often a stage hands on the true gain, and how often a setting that does nothing."""
    rng = random.Random(seed)
    chosen = [stage(design, gain, candidates, rng, k) for k in range(trials)]
    return {"true": sum(c == "s0" for c in chosen) / trials,
            "null": sum(c is not None and c != "s0" for c in chosen) / trials}


def block(trials: int = TRIALS) -> str:
    """The measuring page's table: each preset's design, its power and its hand-on chances."""
    lines = [f"Simulated ({trials} trials each, seeded; a run's noise {SIGMA:.0%}, the machine drifting "
             f"{DRIFT:.0%} between rounds; `python -m cpuopt_helpers.power`):", "",
             f"| preset | screening | confirmation | power for a true {GAIN - 1:.0%} gain | "
             f"that gain among {CANDIDATES} settings handed on | a do-nothing one handed on instead | "
             f"a setting handed on where none of {CANDIDATES} pays |",
             "|---|---|---|---|---|---|---|"]
    for design in DESIGNS:
        name, screen, low, high = design
        rounds = f"{low} rounds, one look" if low == high else f"{low}-{high} rounds, adaptive"
        chances, none = hand_on(design, trials=trials), hand_on(design, gain=1.0, trials=trials)
        lines.append(f"| {name} | {screen} round{'s' * (screen != 1)} | {rounds} | "
                     f"{confirmation_power(design, trials=trials):.0%} | {chances['true']:.0%} | {chances['null']:.1%} | "
                     f"{none['true'] + none['null']:.1%} |")
    return "\n".join(lines)


def write(page: Path, trials: int = TRIALS) -> bool:
    """Put ``block`` between the page's power markers; True where the page changed."""
    text = page.read_text()
    new = re.sub(r"(<!-- power:start -->\n)(?:.*?\n)?(<!-- power:end -->)",
                 lambda m: m.group(1) + block(trials) + "\n" + m.group(2), text, flags=re.S)
    if new == text:
        return False
    page.write_text(new)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cpuopt_helpers.power", description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="PAGE", help="write the table into PAGE's power block")
    args = parser.parse_args(argv)
    if args.write:
        print(f"{args.write}: {'written' if write(Path(args.write)) else 'already current'}")
    else:
        print(block())
    return 0


if __name__ == "__main__":
    sys.exit(main())
