"""A tiny module for run_json_module's tests: prints the variables it was started with."""
import json
import os
import sys

if __name__ == "__main__":
    if sys.argv[1:] == ["fail"]:
        sys.exit("told to fail")
    print(json.dumps({k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CPUOPT_CORES")}))
