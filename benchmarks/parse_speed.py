"""How fast ProfileDNN reads a big log: one million oneDNN verbose lines from a real torch 2.13 log.

Run with `make parse-speed` (or `python benchmarks/parse_speed.py [--verbose-converter DIR]`).
Times, as a user runs them, in paired rounds on the same file:

- ``cpuopt profile LOG --json``: a fresh process, its imports, the parse, the breakdown and the output;
- ``parse_log`` alone, in this process;
- with ``--verbose-converter DIR`` (``scripts/verbose_converter`` of a oneDNN checkout, or
  ``VERBOSE_CONVERTER=DIR make parse-speed``): ``python3 verbose_converter.py -i LOG -g breakdown``,
  its breakdown with its defaults (exec and create events), and with ``-e exec`` only.

Prints JSON: each command's seconds per round, their medians, and the paired ratios
(verbose_converter over cpuopt, round by round); the README quotes it.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbose-converter", metavar="DIR", help="oneDNN's scripts/verbose_converter folder")
    ap.add_argument("--rounds", type=lambda v: max(1, int(v)), default=3, help="paired rounds (default 3)")
    ap.add_argument("--lines", type=int, default=LINES)
    args = ap.parse_args()
    converter = Path(args.verbose_converter) if args.verbose_converter else None
    if converter and not (converter / "verbose_converter.py").exists():
        print(f"parse_speed: no verbose_converter.py in {converter}; name oneDNN's scripts/verbose_converter",
              file=sys.stderr)
        return 2
    commands = {"cpuopt profile --json": ([sys.executable, "-m", "cpuopt_helpers", "profile", "LOG", "--json"], ROOT)}
    if converter:
        vc = [sys.executable, "verbose_converter.py", "-i", "LOG", "-g", "breakdown"]
        commands["verbose_converter breakdown"] = (vc, converter)
        commands["verbose_converter breakdown -e exec"] = (vc + ["-e", "exec"], converter)
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "big.log"
        write_log(log, args.lines)
        times: dict[str, list[float]] = {name: [] for name in [*commands, "parse_log alone"]}
        for _ in range(args.rounds):  # paired: every command once a round, in the same order
            for name, (command, cwd) in commands.items():
                times[name].append(seconds([str(log) if w == "LOG" else w for w in command], cwd))
            start = time.perf_counter()
            parsed = parse_log(log)
            times["parse_log alone"].append(time.perf_counter() - start)
    out = {"lines": args.lines, "rounds": args.rounds, "exec_rows": parsed.counts["exec"],
           "seconds": {k: [round(v, 2) for v in vs] for k, vs in times.items()},
           "median_s": {k: round(statistics.median(vs), 2) for k, vs in times.items()},
           "lines_per_s": round(args.lines / statistics.median(times["parse_log alone"]))}
    ours = times["cpuopt profile --json"]
    out["ratio_over_cpuopt"] = {k: [round(t / o, 2) for t, o in zip(vs, ours)]
                                for k, vs in times.items() if k.startswith("verbose_converter")}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
