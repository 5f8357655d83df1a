#!/bin/sh
# The RetinaNet standard top's steps against the two CPUs' round trip, in one process, twice.
# Run from the repository root after `make setup`: sh data/vcpu_placement/run.sh > RECORD
set -e
here=data/vcpu_placement
gcc -O2 -pthread $here/pingpong.c -o /tmp/cpuopt-pingpong
top="--workload retinanet --preset standard --option classes=80 --allocator tcmalloc --omp-runtime intel
 --dtype bf16 --optimizer lamb --optimizer-impl fused --option focal=fast --option frozen_bn=fused --option loss=fused"
plan=$(.venv/bin/cpuopt bench $top --dry-run)
config=$(printf '%s' "$plan" | sed -e "s/.*--config '//" -e "s/'\$//")
prefix=$(printf '%s' "$plan" | sed -e "s| /[^ ]*/python -m cpuopt_helpers.worker.*||")
echo "# $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'), commit $(git rev-parse --short HEAD)"
echo "# step_ms:round_trip_ns, one line a process; the top: $top" | tr -s ' \n' ' '
echo
for i in 1 2; do $prefix .venv/bin/python $here/steps_and_pingpong.py "$config" 40 /tmp/cpuopt-pingpong; done
