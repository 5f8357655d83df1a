"""One process trains a configuration's steps; before each step a C ping-pong between CPUs 0
and 1 (pingpong.c) times a cache line's round trip. Prints step_ms:round_trip_ns per step.

python steps_and_pingpong.py CONFIG_JSON STEPS PINGPONG_BINARY (run.sh builds both)."""

import json
import subprocess
import sys
import time

from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.worker import prepare

config = json.loads(sys.argv[1])
config.pop("timeout_s", None)
steps, binary = int(sys.argv[2]), sys.argv[3]
prepared = prepare(RunConfig(**{k: tuple(sorted(v.items())) if isinstance(v, dict) else v
                                for k, v in config.items()}))


def round_trip_ns() -> float:
    """The third-slowest of a few batches of 1000 round trips (the first batch starts the thread)."""
    out = subprocess.run([binary, "0.03", "1000"], capture_output=True, text=True).stdout.split()
    return sorted(map(float, out))[-3]


for _ in range(3):
    prepared.step()
for _ in range(steps):
    trip = round_trip_ns()
    t = time.perf_counter()
    prepared.step()
    print(f"{(time.perf_counter() - t) * 1000:.0f}:{trip:.0f}", end=" ", flush=True)
print()
