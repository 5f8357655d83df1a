#!/bin/sh
# The worker's Python probe beside the C ping-pong for two minutes: sh data/vcpu_placement/run_probes.sh > RECORD
set -e
here=data/vcpu_placement
gcc -O2 -pthread $here/pingpong.c -o /tmp/cpuopt-pingpong
echo "# $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'), commit $(git rev-parse --short HEAD)"
echo "# python_ns:c_ns, the worker's probe and the C ping-pong's median batch, in turn, CPUs 0 and 1"
PYTHONPATH=. .venv/bin/python $here/probes.py 120 /tmp/cpuopt-pingpong
