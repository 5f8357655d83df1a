"""How fast ProfileDNN parses: one million oneDNN verbose lines from a real torch 2.13 log.

Run with `make parse-speed`. Prints lines per second and the total; the README quotes it.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

from cpuopt_helpers.profiledn import parse_log

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "onednn_logs" / "cnn_quick_nchw.log"
LINES = 1_000_000


def main() -> int:
    body = [line for line in SAMPLE.read_text().splitlines(keepends=True) if ",exec," in line]
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        for i in range(LINES):
            f.write(body[i % len(body)])
        path = f.name
    start = time.perf_counter()
    parsed = parse_log(path)
    seconds = time.perf_counter() - start
    Path(path).unlink()
    json.dump({"lines": LINES, "seconds": round(seconds, 2), "lines_per_s": round(LINES / seconds),
               "exec_rows": parsed.counts["exec"], "malformed": parsed.counts["malformed"]}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
