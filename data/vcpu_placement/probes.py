"""The worker's probe (``worker.round_trip_ns``: Python on both ends) beside the C ping-pong, taken in
turn for a while between CPUs 0 and 1, so that one can read where the worker's figure stands in
each placement. Prints python_ns:c_ns pairs.

python probes.py SECONDS PINGPONG_BINARY (run_probes.sh builds the binary)."""

import subprocess
import sys
import time

from cpuopt_helpers.worker import round_trip_ns

seconds, binary = float(sys.argv[1]), sys.argv[2]
end = time.time() + seconds
while time.time() < end:
    python = round_trip_ns([0, 1])
    c = sorted(map(float, subprocess.run([binary, "0.03", "1000"], capture_output=True, text=True).stdout.split()))
    print(f"{python:.0f}:{c[len(c) // 2]:.0f}", end=" ", flush=True)  # the C batches' median
    time.sleep(0.2)
print()
