"""Dated records of the commands that measure outside the workbook: `make overhead`, `make
parse-speed` and `make test`'s own duration. Each writes FOLDER/DAY-CPU-ISA-NAME.md (the slug
scheme of the workbook's results pages), stamped with the machine, the day, the commit and the
command that regenerates it, its figures as a table rendered from the command's JSON. A second
run on the same day and machine replaces that day's page; another day or machine is another
file, never merged into one table.

A peer (another tool timed beside ours) is named by ``git_identity``: its commit read from its
own checkout, or the page says its version is unknown and claims nothing against it.

``python -m cpuopt_helpers.records make-test --seconds N --status S [--folder docs/results]``
writes `make test`'s record (the Makefile's `test` target calls it); ``... records index`` rewrites
FOLDER/index.md, every dated page by day and machine (each page writer does it too)."""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple, Sequence

from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.pages import (core_words, cores_words, cpu_slug, day_links, isa_slug, machine_words, words_link,
                                   write_index)
from cpuopt_helpers.provenance import NOT_A_CHECKOUT, ROOT, _git, code_version, own_commit  # noqa: F401 (records' own)
from cpuopt_helpers.system import Facts, collect_facts
from cpuopt_helpers.wording import duration_words



class Row(NamedTuple):
    """One measured figure: what it is, its value with its unit, its interval (where the
    benchmark has one, labelled) and the rounds or runs it came from."""

    figure: str
    value: str
    interval: str = ""
    rounds: str = ""


def git_identity(folder: Path, tracked: str | None = None) -> dict:
    """What FOLDER's git says it is: {"commit" (full), "describe" (``git describe --tags``),
    "origin" (the remote it was cloned from, without any user or token), "dirty" (changes to
    tracked files under FOLDER), "exact"}. ``tracked``: a file that must be under git's control
    there (else the folder is a copy lying in some other checkout). Every value is None, and
    exact False, where FOLDER is not a git checkout."""
    folder = Path(folder)
    commit = _git(folder, "rev-parse", "HEAD")
    if commit and tracked and _git(folder, "ls-files", "--error-unmatch", tracked) is None:
        commit = None
    if not commit:
        return {"commit": None, "describe": None, "origin": None, "dirty": None, "exact": False}
    dirty = bool(_git(folder, "status", "--porcelain", "--untracked-files=no", "--", "."))
    origin = _git(folder, "remote", "get-url", "origin")
    return {"commit": commit, "describe": _git(folder, "describe", "--tags"),
            "origin": re.sub(r"//[^/@]*@", "//", origin) if origin else None, "dirty": dirty, "exact": not dirty}


def page_path(folder: Path, facts: Facts, name: str, day: str) -> Path:
    """FOLDER/DAY-CPU-ISA-NAME.md: one page per day, machine and command."""
    return Path(folder) / f"{day}-{cpu_slug(facts)}-{isa_slug(facts)}-{name}.md"


def stamp(facts: Facts, day: str, command: str, commit: str, preset: str | None = None) -> str:
    """Where, when, with what code and by which command the page's figures were measured."""
    code = code_version()
    setting = f" (preset `{preset}`)" if preset else ""
    return (f"Measured on {day}{setting} on **{facts.cpu_model}** ({core_words(facts, ', ')}{isa_slug(facts)}), "
            f"{cores_words(facts)}, torch {facts.versions.get('torch', '?')}; "
            f"commit {commit}, cpuopt {code['package']} (measuring code {code['measuring_hash']}). "
            f"Regenerate with `{command}`.")


def table(rows: Sequence[Row]) -> list[str]:
    """The figures as a markdown table (``|`` inside a cell escaped)."""
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    return ["| figure | value | interval | rounds |", "|---|---|---|---|",
            *[f"| {' | '.join(cell(c) for c in row)} |" for row in rows]]


def record_page(title: str, stamp_line: str, rows: Sequence[Row], notes: Sequence[str] = ()) -> str:
    """The page's markdown: the title, the stamp, the table, the notes (one paragraph each)."""
    lines = [f"# {title}", "", stamp_line, "", *table(rows)]
    for note in notes:
        lines += ["", note]
    lines += ["", "A page of another machine or day is another file; a rerun on the same day and machine "
              "replaces this one."]
    return "\n".join(lines) + "\n"


def write_record(folder: Path, name: str, title: str, rows: Sequence[Row], command: str, *,
                 notes: Sequence[str] = (), facts: Facts | None = None, when: datetime | None = None,
                 commit: str | None = None, preset: str | None = None, figures: Sequence[tuple] = ()) -> Path:
    """Write FOLDER/DAY-CPU-ISA-NAME.md (replacing that day's page of this machine) and return its
    path. ``when``: the measurement's time (default now, the day taken in UTC like the store's);
    ``facts``: the machine (default this one); ``commit``: default ``own_commit()``; ``figures``:
    (file name, words, matplotlib figure) each, saved stamped beside the page (FOLDER/DAY-CPU-ISA-NAME/)
    and shown below its table."""
    from cpuopt_helpers import plots

    facts = facts or collect_facts()
    day = (when or datetime.now(timezone.utc)).astimezone(timezone.utc).date().isoformat()
    page = page_path(folder, facts, name, day)
    page.parent.mkdir(parents=True, exist_ok=True)
    targets = any(r.figure.startswith("target for ") for r in rows)  # fullstudy.target_rows
    line = stamp(facts, day, command, commit or own_commit(), preset) + words_link(page, targets)
    shown = [f"![{words}]({page.stem}/{plots.save_figure(fig, file, page.parent / page.stem, close=True).name})"
             for file, words, fig in figures]
    page.write_text(record_page(f"{title}: {machine_words(facts)}, {day}", line + day_links(page, machine_words(facts)),
                                rows, [*shown, *notes]))
    write_index(folder)
    return page


def make_test_rows(seconds: float, status: int) -> list[Row]:
    """`make test`'s record: how long it took, and whether it passed."""
    outcome = "passed" if status == 0 else f"failed (exit status {status})"
    return [Row("`make test`, wall time (setup excluded)", duration_words(seconds), "", "1 run"),
            Row("outcome", outcome, "", "1 run")]


def write_make_test(folder: Path, seconds: float, status: int, command: str = "make test", **kwargs) -> Path:
    """The record of one `make test`: its duration and outcome on this machine, today."""
    notes = ["Every test, the notebooks included, as two pytest processes side by side (the notebooks and "
             "the rest); the duration is the whole `test` recipe after `setup`, timed by the Makefile."]
    return write_record(folder, "make-test", "make test", make_test_rows(seconds, status), command,
                        notes=notes, **kwargs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cpuopt_helpers.records", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="record", required=True)
    test = sub.add_parser("make-test", help="the record of one `make test`: its duration and outcome")
    test.add_argument("--seconds", type=float, required=True, help="the recipe's wall time")
    test.add_argument("--status", type=int, required=True, help="the tests' exit status (0: passed)")
    test.add_argument("--folder", type=Path, default=Path("docs/results"))
    test.add_argument("--command", default="make test", help="the command that regenerates the record")
    index = sub.add_parser("index", help="rewrite FOLDER/index.md, every dated page by day (each writer does)")
    index.add_argument("--folder", type=Path, default=Path("docs/results"))
    args = ap.parse_args(argv)
    if args.record == "index":
        try:
            print(f"cpuopt: the index of the dated pages: {write_index(args.folder)}")
        except CpuoptError as exc:
            print(f"cpuopt: {exc}", file=sys.stderr)
            return 2
        return 0
    page = write_make_test(args.folder, args.seconds, args.status, args.command)
    print(f"cpuopt: make test's record: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
