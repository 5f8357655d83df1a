"""How fast ProfileDNN reads a big log: one million oneDNN verbose lines from a real torch 2.13 log.

Run with `make parse-speed` (or `python benchmarks/parse_speed.py [--verbose-converter DIR]`).
Times, as a user runs them, in paired rounds on the same file:

- ``cpuopt profile LOG --json``: a fresh process, its imports, the parse, the breakdown and the output;
- ``parse_log`` alone, in this process;
- with ``--verbose-converter DIR`` (``scripts/verbose_converter`` of a oneDNN checkout, or
  ``VERBOSE_CONVERTER=DIR make parse-speed``): ``python3 verbose_converter.py -i LOG -g breakdown``,
  its breakdown with its defaults (exec and create events), and with ``-e exec`` only.

Prints JSON: each command's seconds per round, their medians, and the paired ratios
(verbose_converter over cpuopt, round by round); with a converter, ``peer``: its exact identity,
the commit its oneDNN checkout's git gives (``git -C DIR rev-parse HEAD``, ``describe --tags``),
and how it was obtained. The converter's code is run where it lies, never copied. With ``--page
FOLDER`` (as `make parse-speed` gives ``docs/results``) it also writes this machine's dated page
FOLDER/DAY-CPU-ISA-parse-speed.md; a ratio against the converter is on it only where its commit is
known and its files unchanged (else the page says the peer's version is unknown).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpuopt_helpers import records  # noqa: E402
from cpuopt_helpers.profiledn import parse_log  # noqa: E402

SAMPLE = ROOT / "data" / "onednn_logs" / "cnn_quick_nchw.log"
LINES = 1_000_000


def write_log(path: Path, lines: int) -> None:
    """The sample's header, then its executed lines repeated to ``lines`` lines."""
    text = SAMPLE.read_text().splitlines(keepends=True)
    body = [line for line in text if ",exec," in line]
    with open(path, "w") as f:
        f.writelines(line for line in text if ",info," in line)
        for i in range(lines):
            f.write(body[i % len(body)])


def seconds(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return took


def peer(converter: Path) -> dict:
    """The converter's exact identity and how it was obtained, from its checkout's git."""
    ident = records.git_identity(converter, tracked="verbose_converter.py")
    at = f"{ident['commit']} ({ident['describe']})" if ident["describe"] else ident["commit"]
    cloned = f", cloned from {ident['origin']}" if ident["origin"] else ""
    if ident["exact"]:
        how = (f"the scripts/verbose_converter folder of a oneDNN checkout at commit {at}{cloned}, "
               "given as VERBOSE_CONVERTER")
    elif ident["commit"]:
        how = (f"the scripts/verbose_converter folder of a oneDNN checkout at commit {at}{cloned}, given as "
               "VERBOSE_CONVERTER, with uncommitted changes to its files: not an exact version, no claim is made")
    else:
        how = ("a folder given as VERBOSE_CONVERTER that is not a git checkout (or whose verbose_converter.py "
               "git does not track): the peer's version is unknown, no claim is made against it")
    return {"tool": "oneDNN scripts/verbose_converter", "folder": str(converter), **ident, "obtained": how}


def measure(commands: dict, rounds: int, lines: int) -> tuple[dict, int]:
    """Each command's seconds per round (paired: every command once a round, in the same order),
    and the exec rows parse_log found."""
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "big.log"
        write_log(log, lines)
        times: dict[str, list[float]] = {name: [] for name in [*commands, "parse_log alone"]}
        for _ in range(rounds):
            for name, (command, cwd) in commands.items():
                times[name].append(seconds([str(log) if w == "LOG" else w for w in command], cwd))
            start = time.perf_counter()
            parsed = parse_log(log)
            times["parse_log alone"].append(time.perf_counter() - start)
    return times, parsed.counts["exec"]


def rows(out: dict) -> list[records.Row]:
    """The page's table from the JSON: each command's median seconds, parse_log's lines per second,
    and the converter over cpuopt round by round where the peer's identity is exact."""
    n = f"{out['rounds']} paired rounds"
    table = [records.Row(f"`{name}`" if name != "parse_log alone" else "`parse_log` alone, in process",
                         f"{out['median_s'][name]:.2f} s (median)", f"range {min(vs):.2f}-{max(vs):.2f} s", n)
             for name, vs in out["seconds"].items()]
    table.append(records.Row("`parse_log` alone: lines per second", f"{out['lines_per_s']:,} lines/s", "", n))
    if out.get("peer", {}).get("exact"):
        for name, ratios in out["ratio_over_cpuopt"].items():
            table.append(records.Row(f"`{name}` over `cpuopt profile --json`, round by round",
                                     f"{statistics.median(ratios):.2f}x (median)",
                                     f"range {min(ratios):.2f}-{max(ratios):.2f}x", n))
    return table


def command_line(out: dict) -> str:
    """The command that regenerates the page."""
    converter = " VERBOSE_CONVERTER=DIR" if out.get("peer") else ""
    if out["rounds"] == 3 and out["lines"] == LINES:
        return f"make parse-speed{converter}"
    return (f"python benchmarks/parse_speed.py{' --verbose-converter DIR' if converter else ''} "
            f"--rounds {out['rounds']} --lines {out['lines']} --page docs/results")


def write_page(out: dict, folder: Path, **kwargs) -> Path:
    """FOLDER/DAY-CPU-ISA-parse-speed.md from the JSON (``kwargs``: records.write_record's facts, when, commit)."""
    notes = [f"A log of {out['lines']:,} oneDNN verbose lines ({out['exec_rows']:,} exec rows) built from "
             "data/onednn_logs/cnn_quick_nchw.log; `cpuopt profile LOG --json` as a user runs it (a fresh process, "
             "its imports, the parse, the breakdown and the output) and `parse_log` alone in the benchmark's process."]
    if out.get("peer"):
        peer_note = f"The peer, oneDNN's verbose_converter (`-g breakdown`): {out['peer']['obtained']}."
        if not out["peer"]["exact"]:
            peer_note += " Its times are in the table as measured; no ratio against it is given."
        notes.append(peer_note + " Its code is run where it lies, never copied into this project.")
    return records.write_record(folder, "parse-speed", "ProfileDNN's parse speed", rows(out), command_line(out),
                                notes=notes, **kwargs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbose-converter", metavar="DIR", help="oneDNN's scripts/verbose_converter folder")
    ap.add_argument("--rounds", type=lambda v: max(1, int(v)), default=3, help="paired rounds (default 3)")
    ap.add_argument("--lines", type=int, default=LINES)
    ap.add_argument("--page", metavar="FOLDER", type=Path,
                    help="also write the dated page FOLDER/DAY-CPU-ISA-parse-speed.md (make parse-speed: docs/results)")
    args = ap.parse_args()
    converter = Path(args.verbose_converter) if args.verbose_converter else None
    if converter and not (converter / "verbose_converter.py").exists():
        print(f"parse_speed: no verbose_converter.py in {converter}; name oneDNN's scripts/verbose_converter",
              file=sys.stderr)
        return 2
    commands = {"cpuopt profile --json": ([sys.executable, "-m", "cpuopt_helpers", "profile", "LOG", "--json"], ROOT)}
    if converter:
        identity = peer(converter)  # read before it runs
        vc = [sys.executable, "verbose_converter.py", "-i", "LOG", "-g", "breakdown"]
        commands["verbose_converter breakdown"] = (vc, converter)
        commands["verbose_converter breakdown -e exec"] = (vc + ["-e", "exec"], converter)
    times, exec_rows = measure(commands, args.rounds, args.lines)
    out = {"lines": args.lines, "rounds": args.rounds, "exec_rows": exec_rows,
           "seconds": {k: [round(v, 2) for v in vs] for k, vs in times.items()},
           "median_s": {k: round(statistics.median(vs), 2) for k, vs in times.items()},
           "lines_per_s": round(args.lines / statistics.median(times["parse_log alone"]))}
    ours = times["cpuopt profile --json"]
    out["ratio_over_cpuopt"] = {k: [round(t / o, 2) for t, o in zip(vs, ours)]
                                for k, vs in times.items() if k.startswith("verbose_converter")}
    if converter:
        out["peer"] = identity
    json.dump(out, sys.stdout, indent=2)
    print()
    if args.page:
        print(f"parse_speed: wrote {write_page(out, args.page)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
