"""The results store: SQLite (WAL), one row per RunResult, loaded as pandas.

Default path ``build/results.sqlite``; ``CPUOPT_RESULTS`` overrides it. Besides results it
keeps small named facts (the roofline, the best configuration so far) that notebooks
hand on to the next step of the ladder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import sqlite3
import statistics
import time
from contextlib import closing
from pathlib import Path
from typing import Callable, Iterable

from cpuopt_helpers import compare
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.provenance import code_version, measuring_env
from cpuopt_helpers.wording import reason_line

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # 2: rows keyed by (sweep, arm, round); sweeps recorded with their code version
SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,
    machine TEXT,
    sweep TEXT NOT NULL,
    arm INTEGER NOT NULL,
    round INTEGER NOT NULL,
    position INTEGER,
    config_hash TEXT NOT NULL,
    tag TEXT,
    status TEXT NOT NULL,
    workload TEXT,
    loaded INTEGER,
    code_version TEXT,
    result TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS results_lookup ON results (sweep, arm, round);
CREATE TABLE IF NOT EXISTS sweeps (
    id TEXT PRIMARY KEY,
    machine TEXT,
    tag TEXT,
    kind TEXT NOT NULL,
    code_version TEXT,
    arms TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (datetime('now'))
);
CREATE TABLE IF NOT EXISTS facts (
    machine TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (datetime('now')),
    PRIMARY KEY (machine, name)
);
"""


def build_dir() -> Path:
    """Where outputs go: CPUOPT_BUILD, else build/ in the repository, else ./build."""
    if os.environ.get("CPUOPT_BUILD"):
        return Path(os.environ["CPUOPT_BUILD"])
    repo = Path(__file__).resolve().parents[1]
    return (repo if (repo / "pyproject.toml").exists() else Path.cwd()) / "build"


def default_path() -> Path:
    return Path(os.environ.get("CPUOPT_RESULTS") or build_dir() / "results.sqlite")


class ResultStore:
    """A SQLite file safe for several writers at once (WAL, one transaction per row)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else default_path()
        if self.path.exists() and not self.path.is_file():
            raise CpuoptError(f"the results store {self.path} is not a file (a folder?): name a file, e.g. "
                              f"CPUOPT_RESULTS={self.path / 'results.sqlite'}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.moved_aside = self._move_aside_older_schema()
            with closing(self._connect()) as db, db:
                db.executescript(SCHEMA)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except (sqlite3.Error, OSError) as exc:
            busy = "another process has held it for a minute: wait for it, or " if "locked" in str(exc) else ""
            raise CpuoptError(f"cannot open the results store {self.path} ({exc}): {busy}point CPUOPT_RESULTS (or "
                              "CPUOPT_BUILD) at a file in a folder this user can write") from exc

    def _move_aside_older_schema(self) -> Path | None:
        """A store of an older schema is renamed, never mixed with new rows (its rows were
        keyed without sweeps, so they cannot be paired honestly)."""
        if not self.path.exists():
            return None
        try:
            with closing(sqlite3.connect(self.path, timeout=60)) as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                has_rows = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'results'").fetchone()
                columns = {row[1] for row in db.execute("PRAGMA table_info(results)")}
        except sqlite3.DatabaseError as exc:  # not a database (a truncated or overwritten file): kept, not read
            target = self._move_aside("corrupt")
            log.warning("%s is not a readable results store (%s); moved aside to %s, starting a new store",
                        self.path, exc, target)
            return target
        if has_rows and version >= SCHEMA_VERSION and not {"sweep", "result"} <= columns:
            target = self._move_aside("foreign")  # another program's database that has a results table
            log.warning("%s is not a cpuopt results store (its results table has no sweep or result column); "
                        "moved aside to %s, starting a new store", self.path, target)
            return target
        if version >= SCHEMA_VERSION or not has_rows:
            return None
        target = self._move_aside(f"schema{version}")
        log.warning("%s held results of an older schema (%d); moved aside to %s, starting a new store",
                    self.path, version, target)
        return target

    def _move_aside(self, why: str) -> Path:
        target = self.path.with_name(f"{self.path.stem}.{why}-{time.strftime('%Y%m%d-%H%M%S')}{self.path.suffix}")
        for suffix in ("", "-wal", "-shm"):
            old = Path(str(self.path) + suffix)
            if old.exists():
                old.rename(Path(str(target) + suffix))
        return target

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=60)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA busy_timeout=60000")
        return db

    def save_result(self, result: dict, sweep: str = "", arm: int = 0, round: int = 0, position: int | None = None,
                    tag: str | None = None) -> int:
        """Write one RunResult in its own transaction, keyed by (sweep, arm, round); return its row id."""
        state = result.get("machine_state") or {}
        code = result.get("code_version")
        with closing(self._connect()) as db, db:
            cur = db.execute(
                "INSERT INTO results (created_at, machine, sweep, arm, round, position, config_hash, tag, status, "
                "workload, loaded, code_version, result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (result["created_at"], result.get("system"), sweep, arm, round, position, result["config_hash"], tag,
                 result["status"], result["config"]["workload"],
                 None if state.get("loaded") is None else int(state["loaded"]),
                 json.dumps(code, sort_keys=True) if code else None, json.dumps(result)))
            return cur.lastrowid

    def add_sweep(self, sweep: str, machine: str | None, tag: str | None, kind: str, arms: list[dict],
                  code_version: dict | None) -> None:
        """Record a sweep (its arms in order) the first time it runs."""
        with closing(self._connect()) as db, db:
            db.execute("INSERT OR IGNORE INTO sweeps (id, machine, tag, kind, code_version, arms) VALUES (?, ?, ?, ?, ?, ?)",
                       (sweep, machine, tag, kind, json.dumps(code_version, sort_keys=True), json.dumps(arms)))

    def sweeps(self, kind: str | None = None, machine: str | None = None) -> list[dict]:
        """The recorded sweeps (oldest first): id, machine, tag, kind, arms (config dicts), code version."""
        query, args = "SELECT id, machine, tag, kind, arms, code_version, created_at FROM sweeps WHERE 1=1", []
        for column, value in (("kind", kind), ("machine", machine)):
            if value is not None:
                query, args = query + f" AND {column} = ?", args + [value]
        with closing(self._connect()) as db:
            rows = db.execute(query + " ORDER BY created_at, rowid", args).fetchall()
        return [{"id": r[0], "machine": r[1], "tag": r[2], "kind": r[3], "arms": json.loads(r[4]),
                 "code_version": json.loads(r[5]) if r[5] else None, "created_at": r[6]} for r in rows]

    def results(self, tag: str | None = None, machine: str | None = None, sweep: str | None = None) -> list[dict]:
        """Stored RunResults (oldest first), each with its sweep, arm, round, position and tag."""
        query, args = "SELECT sweep, arm, round, position, tag, result FROM results WHERE 1=1", []
        for column, value in (("tag", tag), ("machine", machine), ("sweep", sweep)):
            if value is not None:
                query, args = query + f" AND {column} = ?", args + [value]
        with closing(self._connect()) as db:
            rows = db.execute(query + " ORDER BY id", args).fetchall()
        return [dict(json.loads(r[5]), sweep=r[0], arm=r[1], round=r[2], position=r[3], tag=r[4]) for r in rows]

    def load(self, tag: str | None = None, machine: str | None = None):
        """Results as a tidy DataFrame: one row per result, config fields as columns."""
        import pandas as pd

        rows = []
        for r in self.results(tag, machine):
            row = {f"config.{k}": (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r["config"].items()}
            row.update({k: r.get(k) for k in ("tag", "sweep", "arm", "round", "position", "label", "config_hash", "status", "reason",
                                               "samples_per_s", "peak_rss_mb", "loss_first", "loss_last",
                                               "achieved_gflops", "flops_per_step", "startup_s", "system",
                                               "created_at")})
            row.update({"compile_s": r.get("compile_s"), "compile_warm_s": r.get("compile_warm_s"),
                        "params_in_sync": r.get("params_in_sync"),
                        "versions.torch": (r.get("versions") or {}).get("torch"),
                        "versions.ipex": (r.get("versions") or {}).get("ipex"),
                        "loaded": (r.get("machine_state") or {}).get("loaded")})
            row["workload"] = r["config"]["workload"]
            row["step_ms"] = (r.get("step_ms") or {}).get("median")  # a script run has none
            row.update({k: r[k] for k in ("command", "metric") if k in r})
            for phase, ms in (r.get("phase_ms") or {}).items():
                row[f"{phase}_ms"] = ms
            rows.append(row)
        return pd.DataFrame(rows)

    def put_fact(self, machine: str | None, name: str, value) -> None:
        """Store a named fact (JSON) for later notebooks, replacing an older one."""
        with closing(self._connect()) as db, db:
            db.execute("INSERT OR REPLACE INTO facts (machine, name, value, created_at) "
                       "VALUES (?, ?, ?, datetime('now'))", (machine or "", name, json.dumps(value)))

    def fact_names(self, machine: str | None, prefix: str = "") -> list[str]:
        """The names of this machine's facts that start with ``prefix``, sorted."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT name FROM facts WHERE machine = ? AND substr(name, 1, ?) = ? ORDER BY name",
                              (machine or "", len(prefix), prefix)).fetchall()
        return [r[0] for r in rows]

    def get_fact(self, machine: str | None, name: str, default=None):
        with closing(self._connect()) as db:
            row = db.execute("SELECT value FROM facts WHERE machine = ? AND name = ?",
                             (machine or "", name)).fetchone()
        return json.loads(row[0]) if row else default

    def ladder(self, machine: str | None, ladder: str, preset: str) -> list[dict]:
        """A ladder's stored rungs (``Session.hand_on``), checked: a fact cpuopt did not write (edited,
        or from another version) is one line saying so, not a traceback wherever it is read."""
        from cpuopt_helpers.config import RunConfig

        name = f"ladder/{ladder}/{preset}"
        try:
            rungs = self.get_fact(machine, name, [])
            if not isinstance(rungs, list):
                raise ValueError("not a list of rungs")
            for i, rung in enumerate(rungs):
                if not (isinstance(rung, dict) and isinstance(rung.get("step"), str)
                        and isinstance(rung.get("config"), dict) and isinstance(rung.get("evidence") or {}, dict)):
                    raise ValueError(f"rung {i} is not a step with a config")
                RunConfig.from_dict(rung["config"])
        except (ValueError, TypeError, CpuoptError) as exc:
            raise CpuoptError(f"the ladder {name} in {self.path} is not one cpuopt wrote ({exc}); move the store "
                              "aside and climb again (`make run`)") from None
        return rungs


def sweep_id(kind: str, tag: str | None, machine: str | None, configs: list, code: dict,
             env: dict | None = None) -> str:
    """A sweep is its kind, tag, machine, arms in order, the measuring code's version and
    the caller's environment as far as it reaches the measured processes
    (``provenance.measuring_env``): the same notebook re-run on the same code in the same
    environment resumes it; changed code, or an exported OMP_NUM_THREADS, starts a new one."""
    key = json.dumps([kind, tag, machine, [c.config_hash() for c in configs], code.get("measuring_hash")]
                     + ([sorted(env.items())] if env else []))
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def _stored(store: ResultStore, sweep: str) -> dict:
    return {(r["arm"], r["round"]): r for r in store.results(sweep=sweep) if r["status"] in ("ok", "unsupported")}


def run_sweep(configs: Iterable, store: ResultStore, runner: Callable[[object], dict], rounds: int = 1,
              resume: bool = True, tag: str | None = None, machine: str | None = None,
              progress: bool = True) -> list[dict]:
    """Run every config (an arm) once per round, the order inside each round shuffled
    (seeded by the sweep and round, and recorded), saving each result at once.

    Arms are positions in `configs`: the same configuration twice is two arms (an A/A
    test). With ``resume=True`` an (arm, round) this sweep already measured is returned from
    the store, so a sweep killed half-way picks up where it stopped; rows of other sweeps
    are never used. A failed run is stored as a failure row; the sweep goes on.
    """
    from cpuopt_helpers.progress import bar as progress_bar

    configs = list(configs)
    code = code_version()
    sweep = sweep_id("sweep", tag, machine, configs, code, measuring_env(os.environ))
    store.add_sweep(sweep, machine, tag, "sweep", [c.to_dict() for c in configs], code)
    stored = _stored(store, sweep) if resume else {}
    jobs = []
    for r in range(rounds):
        order = list(range(len(configs)))
        random.Random(f"{sweep}/{r}").shuffle(order)
        jobs += [(r, position, arm) for position, arm in enumerate(order)]
    out = []
    bar = progress_bar(iterable=jobs, desc=tag or "sweep", unit="run", disable=not progress)
    for round_, position, arm in bar:
        config = configs[arm]
        if (arm, round_) in stored:
            out.append(dict(stored[(arm, round_)], resumed=True))
            continue
        bar.set_postfix_str(config.label()[:60])
        result = runner(config)
        store.save_result(result, sweep=sweep, arm=arm, round=round_, position=position, tag=tag)
        if result["status"] != "ok":
            log.warning("%s: %s: %s", config.label(), result["status"], reason_line(result["reason"]))
        out.append(dict(result, sweep=sweep, arm=arm, round=round_, position=position, tag=tag))
    warn_loaded(out, tag)
    return sorted(out, key=lambda r: (r["round"], r["arm"]))


def warn_loaded(results: list[dict], what: str | None) -> None:
    """Say how many runs ran on a machine busy with other work (``provenance.is_loaded``)."""
    loaded = sum(bool((r.get("machine_state") or {}).get("loaded")) for r in results)
    if loaded:
        log.warning("%s: %d of %d runs ran on a loaded machine (load average or steal time above what this "
                    "run explains); their ratios are noisier", what or "sweep", loaded, len(results))


APART = 1.6  # a run's probe counts as apart at this many times the shortest round trip of its pair of CPUs
# (data/vcpu_placement/*-probes.txt: on the Zen 4 VM one core complex read up to about 1.5x the shortest, two 1.7x on)


def apart(states: list[dict]) -> list[bool | None]:
    """Per machine state: whether its run's cores were apart, its round trip
    (``machine_state.round_trip_ns``, the worker's probe) at APART x the shortest of runs that timed
    the same pair of CPUs, or more; None where it has no probe or ran loaded (a busy CPU also
    lengthens a round trip)."""
    probed = [bool(s.get("round_trip_ns")) and not s.get("loaded") for s in states]
    shortest: dict[str, float] = {}
    for s, p in zip(states, probed):
        if p:
            pair = json.dumps(s.get("round_trip_cpus"))
            shortest[pair] = min(shortest.get(pair, float("inf")), min(s["round_trip_ns"]))
    return [max(s["round_trip_ns"]) >= APART * shortest[json.dumps(s.get("round_trip_cpus"))] if p else None
            for s, p in zip(states, probed)]


def mixed_pairs(runs: list[dict]) -> tuple[int, int, int]:
    """(mixed, pairs, arm apart): the pairs of runs whose ratio is paired (an arm and the sweep's
    first arm, its baseline, in one round of one sweep: in a comparison b and a; both ok and probed
    on a quiet machine; where a sweep was measured again, each arm's latest run), how many of them
    had one run's cores apart and the other's not (``apart``), and in how many of those the arm's
    run, not the baseline's, was the one apart: either is as likely where the host moves the CPUs
    whichever arm runs, which is what keeps such pairs from favouring one arm. Runs stored alone
    (bench --save, a profile) pair with nothing."""
    by_round: dict[tuple, dict[int, bool]] = {}
    for r, flag in zip(runs, apart([r.get("machine_state") or {} for r in runs])):
        if r.get("status") == "ok" and flag is not None and r.get("arm") is not None:
            by_round.setdefault((r.get("sweep"), r.get("round")), {})[r["arm"]] = flag
    pairs = [(arms[0], flag) for arms in by_round.values() if 0 in arms for arm, flag in arms.items() if arm]
    mixed = [flag for base, flag in pairs if base != flag]
    return len(mixed), len(pairs), sum(mixed)


def apart_sentence(runs: list[dict]) -> str:
    """'' or the sentence that says some runs' cores were apart (``apart``), and in how many pairs of
    runs whose ratio is paired one run's were and the other's not (``mixed_pairs``)."""
    states = [r["machine_state"] for r in runs if r.get("machine_state")]
    flags = apart(states)
    trips = [max(s["round_trip_ns"]) for s, flag in zip(states, flags) if flag]
    if not trips:
        return ""
    shortest = min(min(s["round_trip_ns"]) for s, flag in zip(states, flags) if flag is not None)
    mixed, pairs, arm_apart = mixed_pairs(runs)
    probed = sum(f is not None for f in flags)
    return (f" CPUs apart: in {len(trips)} of {probed} runs probed, two of the run's CPUs sat far apart (a VM's host "
            f"had most likely put them on other core complexes or sockets): a cache line's round trip between them "
            f"took {APART:g}x the shortest timed between the same two CPUs or more (the shortest of all: "
            f"{shortest:.0f} ns), up to {max(trips):.0f} ns. Such steps can run "
            "slower."
            + (f" In {mixed} of {pairs} paired runs (an arm and its baseline in one round, both quiet) only one of the "
               f"two sat apart (the arm in {arm_apart}, the baseline in {mixed - arm_apart}): their ratios are "
               "noisier. The probe runs before and after the timed steps, so these counts "
               "are lower bounds." if pairs else ""))


def loaded_sentence(results: list[dict]) -> str | None:
    """What the machine was doing during these runs, in one sentence for a run's end and its page:
    how many ran on a loaded machine (``provenance.is_loaded``; a tenth or fewer: "mostly quiet"),
    the hypervisor's steal time, and where a VM's host moved the runs' cores apart (``apart_sentence``).
    None when no run recorded its machine state."""
    from statistics import median

    from cpuopt_helpers.provenance import STEAL_LOADED_PCT

    states = [r["machine_state"] for r in results if r.get("machine_state")]
    if not states:
        return None
    said_apart = apart_sentence(results)
    loaded = sum(bool(s.get("loaded")) for s in states)
    steals = [s["steal_pct"] for s in states if s.get("steal_pct") is not None]
    took = f"a median {median(steals):.1f}% of a run's CPU time, at most {max(steals):.1f}%" if steals else ""
    if not loaded:  # no other load; where the host moved CPUs apart, "quiet" would say too much
        lead = "The machine had no other load, yet its CPUs moved" if said_apart else "The machine was quiet"
        return (f"{lead}: none of the {len(states)} runs measured on a loaded machine"
                + (f"; the hypervisor took {took}." if took else ".") + said_apart)
    state = "mostly quiet" if loaded <= 0.1 * len(states) else "busy with other work"
    return (f"The machine was {state}: {loaded} of {len(states)} runs measured on a loaded machine "
            f"(a load average above the run's own, other processes busy during its timed steps, or more than "
            f"{STEAL_LOADED_PCT:.0f}% of its CPU time taken by the hypervisor{': it took ' + took if took else ''}). "
            "Such runs are slower and their ratios noisier: on a "
            "quiet machine the same run takes less time, and its intervals are narrower." + said_apart)


def round_line(i: int, order: tuple[str, str], speeds: tuple, rounds: list[tuple]) -> str:
    """'round 3 (BA): a 41.2, b 45.0 samples/s; running ratio 1.09x over 3 rounds' (b over a)."""
    a, b = (f"{v:.2f}" if v is not None else "failed" for v in speeds)
    ratio = compare.paired_ratio([r[0] for r in rounds], [r[1] for r in rounds], min_rounds=1)
    running = (f"running ratio {ratio['ratio']:.2f}x over {ratio['n']} round{'s' * (ratio['n'] != 1)}"
               if ratio["n"] else "no complete round yet")
    return f"round {i + 1} ({''.join(order).upper()}): a {a}, b {b} samples/s; {running}"


class RunTimes:
    """How long each arm's runs took, and the run under way: the one an interruption cuts short,
    left out of the rounds but said (a run that hangs or crawls is why one presses Ctrl-C)."""

    def __init__(self):
        self.took: dict[str, list[float]] = {"a": [], "b": []}
        self.current: tuple[str, float] | None = None

    def start(self, arm: str) -> None:
        self.current = (arm, time.monotonic())

    def stop(self) -> None:
        arm, start = self.current
        self.took[arm].append(time.monotonic() - start)
        self.current = None

    def cut(self) -> dict | None:
        """The run under way: its arm, how long it had run, and that arm's median run (None before one ended)."""
        if self.current is None:
            return None
        arm, start = self.current
        took = self.took[arm]
        return {"arm": arm, "ran_s": time.monotonic() - start, "median_s": statistics.median(took) if took else None}


def ab_sweep(store: ResultStore, a, b, tag: str | None, machine: str | None, min_rounds: int, max_rounds: int) -> str:
    """The A/B's sweep, stored with its design: the same comparison on the same code resumes it."""
    code = code_version()
    # the stopping design is part of the comparison: its boundary, so its interval and verdict
    # (the default design keeps the identity comparisons stored before this had)
    default = (min_rounds, max_rounds) == (compare.MIN_ROUNDS, compare.MAX_ROUNDS)
    design = "" if default else f":{min_rounds}-{max_rounds}"
    sweep = sweep_id("ab" + design, tag, machine, [a, b], code, measuring_env(os.environ))
    store.add_sweep(sweep, machine, tag, "ab", [a.to_dict(), b.to_dict()], code)
    store.put_fact(machine, f"ab/{sweep}", {"min_rounds": min_rounds, "max_rounds": max_rounds})
    return sweep


def stored_rounds(stored: dict) -> list[tuple]:
    """Every stored round, as it was measured: a round an interrupted run or a failure left
    incomplete stays unpaired (None), and new rounds take fresh numbers after the last one, so a
    stored run is never paired with a fresh one (their drift would not cancel)."""
    return [tuple(stored[(arm, i)]["samples_per_s"] if (arm, i) in stored else None for arm in (0, 1))
            for i in range(max((i for _, i in stored), default=-1) + 1)]


def run_comparison(a, b, store: ResultStore, runner: Callable[[object], dict], tag: str | None = None,
                   machine: str | None = None, min_rounds: int = compare.MIN_ROUNDS,
                   max_rounds: int = compare.MAX_ROUNDS, budget_s: float | None = None, resume: bool = True,
                   progress: bool = True, say: Callable[[str], None] | None = None) -> dict:
    """The adaptive A/B of `compare.run_adaptive` on two configurations (b over a), each run
    stored as it lands in a sweep of its own; a resumed comparison continues after its stored
    rounds (complete ones count; an incomplete one stays stored, unpaired). The progress bar
    shows the running ratio; ``say`` gets one line per round (`cpuopt compare --json` prints
    them to stderr)."""
    from cpuopt_helpers.progress import bar as progress_bar

    sweep = ab_sweep(store, a, b, tag, machine, min_rounds, max_rounds)
    done, times = stored_rounds(_stored(store, sweep) if resume else {}), RunTimes()
    seed = int(sweep[:8], 16)
    bar = progress_bar(total=max_rounds, initial=len(done), desc=f"{tag or 'compare'} A/B", unit="round",
                       disable=not progress)
    runs = []

    def measure(arm: str, round_: int) -> float | None:
        index = 0 if arm == "a" else 1
        config = (a, b)[index]
        times.start(arm)
        result = runner(config)
        times.stop()
        position = compare.round_order(round_, seed).index(arm)
        store.save_result(result, sweep=sweep, arm=index, round=round_, position=position, tag=tag)
        runs.append(dict(result, sweep=sweep, arm=index, round=round_, position=position, tag=tag))
        if result["status"] != "ok":
            log.warning("%s: %s: %s", config.label(), result["status"], reason_line(result["reason"]))
            # a timeout is scored at the throughput it reached (slowness counts against it); a crash is not scored
            return result.get("reached_samples_per_s") if result["status"] == "timeout" else None
        return result["samples_per_s"]

    def on_round(i: int, speeds: tuple) -> None:
        line = round_line(i, compare.round_order(i, seed), speeds, [r for r in done] + rounds)
        bar.set_postfix_str(line.split("; ")[-1])
        bar.update()
        if say:
            say(line)

    def full(out: dict) -> dict:
        return dict(out, sweep=sweep, tag=tag, a=a.to_dict(), b=b.to_dict(),
                    failures=[r["reason"] for r in runs if r["status"] != "ok"], machine_sentence=loaded_sentence(runs))

    rounds: list[tuple] = []
    try:
        out = compare.run_adaptive(measure, done=done, min_rounds=min_rounds, max_rounds=max_rounds,
                                   budget_s=budget_s, seed=seed,
                                   on_round=lambda i, r: (rounds.append(r), on_round(i, r)))
    except KeyboardInterrupt as exc:  # the rounds measured so far, for the caller to say (`cpuopt compare`)
        exc.partial = dict(full(exc.partial), cut_run=times.cut()) if hasattr(exc, "partial") else None
        raise
    finally:
        bar.close()
    warn_loaded(runs, tag)
    return full(out)
