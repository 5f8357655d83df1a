"""The one comparison rule: paired rounds -> ratio, honest interval, verdict; adaptive A/B.

Every "faster", "slower" or interval the workbook prints comes from here.

- The unit of evidence is one round: each arm measured once, in a fresh worker process,
  back to back, so drift of the shared machine hits both. The statistic is the log of
  b's throughput over a's in each round.
- ``paired_ratio``: the ratio is the geometric mean of the paired ratios (it lies inside
  its interval); the interval is Student's t on the log ratios, honest at small n. Below
  ``min_rounds`` (default 5) there is no interval and the verdict is ``too few rounds``:
  with 2-3 rounds any interval is either the range of the rounds (a bootstrap) or
  uselessly wide (t with 1-2 degrees of freedom).
- Verdicts: ``faster`` / ``slower`` (the interval excludes 1), ``equivalent`` (two one-sided
  tests, TOST: the interval of the twice-one-sided level, 90% for a fixed number of rounds
  and a 95% rule, lies inside 1 +- margin), ``no different`` (it straddles), ``too few rounds``.
- A ``faster`` setting is worth handing on only when its ratio is also at least
  1 + ``min_gain`` (``pays``; default 2%): a real but tiny gain is not worth a change.
- Over a ladder, each stage's confirmation errs on its own (a do-nothing setting is handed on
  about 2.5% of the time a stage, about 10% of ladders over five stages); what guards the whole
  ladder is its headline, the top against PyTorch's defaults in fresh rounds of a fixed number,
  whose false ``faster`` stays at 2.5% however many rungs were climbed.
- ``run_adaptive``: rounds continue from ``min_rounds`` to ``max_rounds`` until a verdict
  is decided or the time budget is spent. Looking after every round inflates false wins,
  so each look tests at a per-look level calibrated by simulation (a Pocock-type
  boundary on the t statistic's p-value) that keeps the overall false faster/slower rate
  at 1 - confidence; the interval printed after stopping is the repeated-confidence
  interval at that per-look level, and says so. Equivalence is calibrated the same way, on
  its own: each look's one-sided tests use the level that keeps the chance of calling a
  setting equivalent when it truly sits at the margin's edge, over all the looks, at
  1 - confidence (``per_look_confidence(..., sided=1)``).
- Order inside a round alternates (AB, BA, AB, ...) from a seeded random start, so neither
  arm always runs second; the order is recorded.
"""

from __future__ import annotations

import functools
import math
import random
import time
from typing import Callable, Sequence

MIN_ROUNDS = 5
MAX_ROUNDS = 14
CONFIDENCE = 0.95
MARGIN = 0.05
MIN_GAIN = 0.02  # the smallest confirmed gain worth handing on (``pays``)
# a one-look confirmation (``make run``'s standard preset): the fewest rounds that find a true 15%
# gain at least 60% of the time at the simulation's noise (10% a run; tests/test_compare.py)
FIXED_ROUNDS = 8
DECIDED = ("faster", "slower", "equivalent")
# per_look_confidence's result for the defaults, computed once (tests recompute it)
CALIBRATED = {(MIN_ROUNDS, MAX_ROUNDS, CONFIDENCE, 2): 0.98728, (MIN_ROUNDS, MAX_ROUNDS, CONFIDENCE, 1): 0.98559}
VERDICTS = DECIDED + ("no different", "too few rounds")


def _t_within(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer df (Abramowitz & Stegun 26.7.3-4): the
    standard library only, since kernel benchmarks also run under the IPEX runtime."""
    theta = math.atan(t / math.sqrt(df))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2:  # odd
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


@functools.lru_cache(maxsize=1024)
def _t_quantile(p: float, df: int) -> float:
    """Student's t quantile for p > 0.5, by bisection on ``_t_within``."""
    target, low, high = 2 * p - 1, 0.0, 1.0
    while _t_within(high, df) < target:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_within(mid, df) < target else (low, mid)
    return (low + high) / 2


def log_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """log(b/a) of every round where both arms measured a positive throughput."""
    if len(a) != len(b):
        raise ValueError(f"paired rounds need equal lengths, got {len(a)} and {len(b)}")
    return [math.log(y / x) for x, y in zip(a, b)
            if x is not None and y is not None and x == x and y == y and x > 0 and y > 0]


def paired_ratio(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE,
                 margin: float = MARGIN, min_rounds: int = MIN_ROUNDS, equivalence: float | None = None) -> dict:
    """b over a from paired rounds (throughputs, higher is better): ratio, interval, verdict.

    ``ci_low``/``ci_high`` are NaN below ``min_rounds``; ``label`` names the interval.
    ``equivalence``: 1 - the level of each one-sided test of the equivalence verdict (default
    ``confidence``: at a fixed number of rounds, 5% false equivalence at the margin's edge).
    """
    logs = log_ratios(a, b)
    n = len(logs)
    out = {"ratio": math.exp(sum(logs) / n) if n else math.nan, "ci_low": math.nan, "ci_high": math.nan,
           "n": n, "verdict": "too few rounds", "confidence": confidence, "margin": margin,
           "min_rounds": min_rounds, "label": f"{confidence:.0%} CI"}
    if n < max(min_rounds, 2):
        return out
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    se = sd / math.sqrt(n)
    half = _t_quantile(1 - (1 - confidence) / 2, n - 1) * se
    half_eq = _t_quantile(equivalence or confidence, n - 1) * se  # two one-sided tests
    low, high = math.exp(mean - half), math.exp(mean + half)
    if low > 1:
        verdict = "faster"
    elif high < 1:
        verdict = "slower"
    elif math.exp(mean - half_eq) > 1 / (1 + margin) and math.exp(mean + half_eq) < 1 + margin:
        verdict = "equivalent"
    else:
        verdict = "no different"
    return dict(out, ci_low=low, ci_high=high, verdict=verdict, sd=sd, level=confidence)


POWER = 0.80  # the power a detectable gain is stated at


def detectable_gain(result: dict | None, power: float = POWER) -> float | None:
    """The smallest gain a comparison could have detected with ``power`` at its observed noise:
    exp((t(1 - a/2, n-1) + t(power, n-1)) * sd / sqrt(n)) - 1, with sd the standard deviation of
    the paired log ratios and a the level its verdict used (a sequential design's per-look one).
    None where it has no interval (below its minimum rounds) to say it from."""
    if not result or result.get("sd") is None or (result.get("n") or 0) < 2 or result.get("level") is None:
        return None
    n, alpha = result["n"], 1 - result["level"]
    spread = (_t_quantile(1 - alpha / 2, n - 1) + _t_quantile(power, n - 1)) * result["sd"] / math.sqrt(n)
    return math.exp(spread) - 1


def chain(steps: Sequence[dict], confidence: float = CONFIDENCE) -> dict:
    """The product of several independent comparisons (a ladder's rungs, each b over the rung
    before): the ratio to the first rung's baseline, with the t interval of the sum of the rungs'
    log means, its standard error sqrt(sum se_i^2) and Welch-Satterthwaite's degrees of freedom
    (each rung's se_i = sd_i / sqrt(n_i), df_i = n_i - 1). A rung stored without its sd (before
    comparisons kept it) falls back to adding log half-widths in quadrature, which is about 27%
    too wide. Without an interval for every step there is none for the chain. No steps: the ratio
    1, exactly. Labelled what it is: the product of the rungs, after selection (a rung is in the
    chain because it was confirmed faster: the product reads high; the headline is a fresh
    end-to-end comparison).
    """
    out = {"ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0, "n": sum(s.get("n") or 0 for s in steps),
           "steps": len(steps), "verdict": "no different", "margin": MARGIN, "min_rounds": MIN_ROUNDS,
           "label": f"product of the rungs (after selection), {confidence:.0%} CI"}
    if not steps:
        return out
    logs = [math.log(s["ratio"]) for s in steps]
    out["ratio"] = math.exp(sum(logs))
    bounds = [(s.get("ci_low"), s.get("ci_high")) for s in steps]
    if any(lo is None or hi is None or not lo > 0 or not hi > 0 for lo, hi in bounds):  # NaN fails "> 0"
        return dict(out, ci_low=math.nan, ci_high=math.nan, verdict="too few rounds")
    if len(steps) == 1:  # one step: its own interval, as it was labelled
        return dict(out, ci_low=bounds[0][0], ci_high=bounds[0][1], label=steps[0].get("label", out["label"]),
                    verdict="faster" if bounds[0][0] > 1 else "slower" if bounds[0][1] < 1 else "no different")
    if all(s.get("sd") is not None and (s.get("n") or 0) >= 2 for s in steps):
        var = [s["sd"] ** 2 / s["n"] for s in steps]
        df = sum(var) ** 2 / sum(v ** 2 / (s["n"] - 1) for v, s in zip(var, steps)) if sum(var) > 0 else 1e9
        half = _t_quantile(1 - (1 - confidence) / 2, max(1, int(df))) * math.sqrt(sum(var))
        centre = sum(logs)
    else:
        half = math.sqrt(sum(((math.log(hi) - math.log(lo)) / 2) ** 2 for lo, hi in bounds))
        centre = sum((math.log(hi) + math.log(lo)) / 2 for lo, hi in bounds)
    low, high = math.exp(centre - half), math.exp(centre + half)
    return dict(out, ci_low=low, ci_high=high,
                verdict="faster" if low > 1 else "slower" if high < 1 else "no different")


@functools.lru_cache(maxsize=32)
def per_look_confidence(min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS,
                        confidence: float = CONFIDENCE, sims: int = 200_000, seed: int = 20261130,
                        sided: int = 2) -> float:
    """The confidence each look uses so that looking at every round from min to max
    rounds keeps the overall false rate at 1 - confidence: of faster/slower (``sided=2``: a
    two-sided test of a setting that does nothing), or of equivalent (``sided=1``: the one-sided
    test that a setting truly at the margin's edge lies inside it; the other side only makes
    equivalence rarer).

    Calibrated by simulating those comparisons (normal log ratios; the t statistic's null
    distribution does not depend on the noise level): the per-look level is the
    (1 - confidence) quantile of the smallest p-value over the looks.
    """
    import numpy as np
    from scipy.stats import t

    if max_rounds <= min_rounds:
        return confidence
    if (min_rounds, max_rounds, confidence, sided) in CALIBRATED and (sims, seed) == (200_000, 20261130):
        return CALIBRATED[(min_rounds, max_rounds, confidence, sided)]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((sims, max_rounds))
    csum, csq = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    smallest = np.ones(sims)
    for n in range(max(min_rounds, 2), max_rounds + 1):
        mean = csum[:, n - 1] / n
        var = (csq[:, n - 1] - n * mean * mean) / (n - 1)
        stat = mean / np.sqrt(np.maximum(var, 1e-300) / n)
        p = 2 * t.sf(np.abs(stat), n - 1) if sided == 2 else t.cdf(stat, n - 1)
        smallest = np.minimum(smallest, p)
    return float(1 - np.quantile(smallest, 1 - confidence))


def sequential_ratio(a: Sequence[float], b: Sequence[float], min_rounds: int = MIN_ROUNDS,
                     max_rounds: int = MAX_ROUNDS, confidence: float = CONFIDENCE, margin: float = MARGIN) -> dict:
    """``paired_ratio`` at the per-look level of an adaptive comparison: the verdict and the
    repeated-confidence interval that stay honest however many rounds were looked at."""
    level = per_look_confidence(min_rounds, max_rounds, confidence)
    equivalence = per_look_confidence(min_rounds, max_rounds, confidence, sided=1)
    out = paired_ratio(a, b, level, margin, min_rounds, equivalence)
    out.update(confidence=confidence, per_look_confidence=level, max_rounds=max_rounds)
    if max_rounds > min_rounds:  # else one look at a fixed number of rounds: the plain interval
        out["label"] = f"{confidence:.0%} repeated-confidence interval, per-look {level:.1%}"
    return out


def round_order(round_index: int, seed: int) -> tuple[str, str]:
    """Which arm runs first in a round: alternating AB/BA from a seeded random start."""
    first = random.Random(seed).randrange(2)
    return ("a", "b") if (round_index + first) % 2 == 0 else ("b", "a")


def extra_slot(round_index: int, seed: int, arms: int = 2) -> int:
    """Where a third configuration runs inside a round of two arms (0: first, 1: between them,
    2: last): a seeded random position each round, so that no slot's drift or warm cache always
    falls on it (run_cpu's defaults in `cpuopt tune`'s final rounds)."""
    return random.Random(f"{seed}/{round_index}").randrange(arms + 1)


def arm_fails(rounds: Sequence[Sequence[float | None]]) -> bool:
    """An arm cannot run: it failed in the last two rounds, and in at least half of its runs so far.
    (The same arm failing twice running alone would end about 6% of 14-round comparisons where 5%
    of the runs fail at random; with the half, under 1%. An arm that always fails stops in 2 rounds.)"""
    if len(rounds) < 2:
        return False
    return any(rounds[-1][k] is None and rounds[-2][k] is None and 2 * sum(r[k] is None for r in rounds) >= len(rounds)
               for k in (0, 1))


def run_adaptive(measure: Callable[[str, int], float | None], done: Sequence[tuple[float, float]] = (),
                 min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS, budget_s: float | None = None,
                 confidence: float = CONFIDENCE, margin: float = MARGIN, seed: int = 0,
                 clock: Callable[[], float] = time.monotonic, on_round=None, reserved: bool = False) -> dict:
    """An adaptive, counterbalanced A/B: ``measure(arm, round) -> throughput`` ("a" or "b"; None
    when that run failed).

    ``done`` holds rounds already measured (a resumed comparison). Only complete rounds (both
    arms measured) count towards ``min_rounds`` and ``max_rounds``; a round with a failed run is
    kept, unpaired, and another round runs in its place (at most ``max_rounds`` of them). Stops
    when the verdict is faster, slower or equivalent, at ``max_rounds`` complete rounds, when
    the next round would not fit in ``budget_s``, or when an arm cannot run (``arm_fails``:
    ``stopped`` "failed"; failures of different arms, or rare ones, are noise).
    Returns ``sequential_ratio``'s dict plus the rounds, their order, how many failed, and why
    it stopped. ``reserved``: the caller kept time for ``min_rounds`` rounds (``cpuopt tune``'s
    final rounds), so the budget ends the comparison only after them.
    """
    rounds = [tuple(r) for r in done]
    sequential_ratio([], [], min_rounds, max_rounds, confidence, margin)  # calibrates (cached) the design's
    # per-look levels before anything runs: an interruption's look needs them at once
    try:
        stopped = _adapt(measure, rounds, min_rounds, max_rounds, budget_s, confidence, margin, seed, clock,
                         on_round, reserved)
    except KeyboardInterrupt as exc:  # Ctrl-C or a signal: the rounds complete so far, at this look, go with it
        exc.partial = _verdict(rounds, seed, min_rounds, max_rounds, confidence, margin, "interrupted")
        raise
    return _verdict(rounds, seed, min_rounds, max_rounds, confidence, margin, stopped)


def _adapt(measure, rounds: list, min_rounds: int, max_rounds: int, budget_s: float | None,
           confidence: float, margin: float, seed: int, clock, on_round, reserved: bool) -> str:
    """``run_adaptive``'s loop: measures rounds into ``rounds`` until it stops; why it stopped."""
    start, spent = clock(), []
    stopped = "max_rounds"
    while True:
        result = sequential_ratio([r[0] for r in rounds], [r[1] for r in rounds], min_rounds, max_rounds,
                                  confidence, margin)
        complete = sum(None not in r for r in rounds)
        if complete >= min_rounds and result["verdict"] in DECIDED:
            stopped = "decided"
            break
        if complete >= max_rounds or len(rounds) - complete >= max_rounds:
            break
        if arm_fails(rounds):
            stopped = "failed"  # one arm cannot run: more rounds cannot help
            break
        per_round = (sum(spent) / len(spent)) if spent else 0.0
        if budget_s is not None and spent and clock() - start + per_round > budget_s and not (
                reserved and complete < min_rounds):
            stopped = "budget"
            break
        t0, i = clock(), len(rounds)
        arms = round_order(i, seed)
        got = {arm: measure(arm, i) for arm in arms}
        rounds.append((got["a"], got["b"]))
        spent.append(clock() - t0)
        if on_round:
            on_round(i, rounds[-1])
    return stopped


def _verdict(rounds: list, seed: int, min_rounds: int, max_rounds: int, confidence: float, margin: float,
             stopped: str) -> dict:
    """The comparison at its last look: ``sequential_ratio``'s dict, the rounds, their order and why it stopped.
    Interrupted where that look decides (the interruption came after a round, before its look), it
    stopped where the design would have: ``decided``."""
    result = sequential_ratio([r[0] for r in rounds], [r[1] for r in rounds], min_rounds, max_rounds,
                              confidence, margin)
    if stopped == "interrupted" and result["verdict"] in DECIDED and result["n"] >= min_rounds:
        stopped = "decided"
    order = [round_order(i, seed) for i in range(len(rounds))]
    logs = log_ratios([r[0] for r in rounds], [r[1] for r in rounds])
    if result["verdict"] == "too few rounds" and len(logs) >= 3:  # the noise it saw: what min_rounds would detect
        mean = sum(logs) / len(logs)
        result.update(sd=math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)),
                      level=result["per_look_confidence"])
    result.update(rounds=[list(r) for r in rounds], order=["".join(o).upper() for o in order], stopped=stopped,
                  failed_rounds=sum(None in r for r in rounds))
    return result


def gain_words(gain: float) -> str:
    """``detectable_gain`` in words: 'a gain of 7% or more'; beyond doubling, where a percentage of
    thousands reads as a measurement, what it means: the noise drowns any plausible gain."""
    return f"a gain of {gain:.0%} or more" if gain < 1 else "only a gain above 2x (the noise seen was that large)"


def describe(result: dict | None, what: str = "") -> str:
    """'1.12x (95% CI: 1.03-1.22, 8 rounds): faster' - the one way a comparison is worded."""
    if not result or not result.get("n"):
        return f"{what}not measured" if what else "not measured"
    head = f"{what}{result['ratio']:.2f}x"
    if result["verdict"] == "too few rounds" and "steps" in result:
        return f"{head} (chained over {result['steps']} rungs, one of them without an interval): too few rounds"
    if result["verdict"] == "too few rounds" and result.get("screened"):  # ranks settings, claims nothing
        return f"{head} (screened only, {result['n']} round{'s' * (result['n'] != 1)})"
    if result["verdict"] == "too few rounds":  # a confirmation cut short says what its minimum would detect
        needed = result.get("min_rounds", MIN_ROUNDS)
        gain = detectable_gain(dict(result, n=needed)) if result["n"] >= 3 else None  # an sd from 3 rounds at least
        more = f"; at the noise seen, {needed} rounds could detect {gain_words(gain)}" if gain is not None else ""
        return (f"{head} ({result['n']} round{'s' * (result['n'] != 1)}, fewer than the {needed} a verdict needs"
                f"{more}): too few rounds")
    label = result.get("label", "95% CI")
    ends = interval_ends(result["ci_low"], result["ci_high"])
    gain = detectable_gain(result)
    cut = {"interrupted": "interrupted", "budget": "its time budget spent"}.get(result.get("stopped"))
    planned = result.get("max_rounds", MAX_ROUNDS)
    if cut and result["verdict"] == "no different" and result["n"] < planned:  # stopped short of its design
        could = f"; these {result['n']} rounds could detect {gain_words(gain)}" if gain is not None else ""
        return (f"{head} ({label}: {ends}, {result['n']} rounds): undecided, "
                f"{cut} after {result['n']} of up to {planned} rounds (the interval includes 1{could})")
    words = {"faster": "faster", "slower": "slower", "equivalent": f"equivalent (within +-{result.get('margin', MARGIN):.0%})",
             "no different": "no different (within noise" + (
                 f"; it could have detected {gain_words(gain)})" if gain is not None else ")")}
    return f"{head} ({label}: {ends}, {result['n']} rounds): {words[result['verdict']]}"


def interval_ends(low: float, high: float) -> str:
    """'1.03-1.22': two decimals, more where an end would round onto 1 without being 1 (a 'faster' whose
    lower end reads 1.00 says less than it found: 1.003)."""
    digits = 2
    while digits < 4 and any(end != 1 and f"{end:.{digits}f}" == f"{1:.{digits}f}" for end in (low, high)):
        digits += 1
    return f"{low:.{digits}f}-{high:.{digits}f}"


def pays(result: dict | None, min_gain: float = MIN_GAIN) -> bool:
    """Worth handing on: confirmed faster, and by at least ``min_gain``."""
    return bool(result) and result.get("verdict") == "faster" and result["ratio"] >= 1 + min_gain
