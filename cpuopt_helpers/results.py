"""The results store: SQLite (WAL), one row per RunResult, loaded as pandas.

Default path ``build/results.sqlite``; ``CPUOPT_RESULTS`` overrides it. Besides results it
keeps small named facts (the roofline, the best configuration so far) that notebooks
hand on to the next step of the ladder.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Callable, Iterable

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,
    machine TEXT,
    config_hash TEXT NOT NULL,
    repeat INTEGER NOT NULL DEFAULT 0,
    tag TEXT,
    status TEXT NOT NULL,
    workload TEXT,
    result TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS results_lookup ON results (machine, config_hash, repeat, tag);
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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db, db:
            db.executescript(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=60)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA busy_timeout=60000")
        return db

    def save_result(self, result: dict, repeat: int = 0, tag: str | None = None) -> int:
        """Write one RunResult in its own transaction; return its row id."""
        with closing(self._connect()) as db, db:
            cur = db.execute(
                "INSERT INTO results (created_at, machine, config_hash, repeat, tag, status, workload, result) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (result["created_at"], result.get("system"), result["config_hash"], repeat, tag,
                 result["status"], result["config"]["workload"], json.dumps(result)))
            return cur.lastrowid

    def has_result(self, machine: str | None, config_hash: str, repeat: int, tag: str | None = None) -> bool:
        """Whether a finished (not failed) result of this config and repeat exists here."""
        with closing(self._connect()) as db:
            row = db.execute(
                "SELECT 1 FROM results WHERE machine IS ? AND config_hash = ? AND repeat = ? AND tag IS ? "
                "AND status IN ('ok', 'unsupported') LIMIT 1", (machine, config_hash, repeat, tag)).fetchone()
        return row is not None

    def results(self, tag: str | None = None, machine: str | None = None) -> list[dict]:
        query, args = "SELECT repeat, tag, result FROM results WHERE 1=1", []
        if tag is not None:
            query, args = query + " AND tag = ?", args + [tag]
        if machine is not None:
            query, args = query + " AND machine = ?", args + [machine]
        with closing(self._connect()) as db:
            rows = db.execute(query + " ORDER BY id", args).fetchall()
        return [dict(json.loads(r[2]), repeat=r[0], tag=r[1]) for r in rows]

    def load(self, tag: str | None = None, machine: str | None = None):
        """Results as a tidy DataFrame: one row per result, config fields as columns."""
        import pandas as pd

        rows = []
        for r in self.results(tag, machine):
            row = {f"config.{k}": (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r["config"].items()}
            row.update({k: r.get(k) for k in ("tag", "repeat", "label", "config_hash", "status", "reason",
                                               "samples_per_s", "peak_rss_mb", "loss_first", "loss_last",
                                               "achieved_gflops", "flops_per_step", "startup_s", "system",
                                               "created_at")})
            row.update({"compile_s": r.get("compile_s"), "params_in_sync": r.get("params_in_sync"),
                        "versions.torch": (r.get("versions") or {}).get("torch"),
                        "versions.ipex": (r.get("versions") or {}).get("ipex")})
            row["workload"] = r["config"]["workload"]
            row["step_ms"] = r["step_ms"]["median"]
            for phase, ms in (r.get("phase_ms") or {}).items():
                row[f"{phase}_ms"] = ms
            rows.append(row)
        return pd.DataFrame(rows)

    def put_fact(self, machine: str | None, name: str, value) -> None:
        """Store a named fact (JSON) for later notebooks, replacing an older one."""
        with closing(self._connect()) as db, db:
            db.execute("INSERT OR REPLACE INTO facts (machine, name, value, created_at) "
                       "VALUES (?, ?, ?, datetime('now'))", (machine or "", name, json.dumps(value)))

    def get_fact(self, machine: str | None, name: str, default=None):
        with closing(self._connect()) as db:
            row = db.execute("SELECT value FROM facts WHERE machine = ? AND name = ?",
                             (machine or "", name)).fetchone()
        return json.loads(row[0]) if row else default


def run_sweep(configs: Iterable, store: ResultStore, runner: Callable[[object], dict], repeats: int = 1,
              resume: bool = True, tag: str | None = None, machine: str | None = None,
              progress: bool = True) -> list[dict]:
    """Run every config `repeats` times, interleaved (A B A B ...), saving each result at once.

    With ``resume=True`` a (config, repeat) already measured on this machine is skipped and
    its stored result returned, so a sweep killed half-way picks up where it stopped.
    A failed run is stored as a failure row; the sweep goes on.
    """
    from tqdm.auto import tqdm

    configs = list(configs)
    jobs = [(r, c) for r in range(repeats) for c in configs]
    stored = {}
    if resume:
        for row in store.results(tag=tag, machine=machine):
            if row["status"] in ("ok", "unsupported"):
                stored[(row["config_hash"], row["repeat"])] = row
    out = []
    bar = tqdm(jobs, desc=tag or "sweep", unit="run", disable=not progress)
    for repeat, config in bar:
        key = (config.config_hash(), repeat)
        if key in stored:
            out.append(dict(stored[key], resumed=True))
            continue
        bar.set_postfix_str(config.label()[:60])
        result = runner(config)
        store.save_result(result, repeat=repeat, tag=tag)
        if result["status"] != "ok":
            log.warning("%s: %s: %s", config.label(), result["status"], result["reason"].splitlines()[0])
        out.append(dict(result, repeat=repeat, tag=tag))
    return out
