"""Pin one torchrun rank to its own cores, then run the user's script in its place.

``cpuopt launch --nproc-per-node N -- train.py ARGS`` runs
``python -m torch.distributed.run --nproc-per-node N -m cpuopt_helpers.rank_exec train.py ARGS``.
A stock torchrun sets OMP_NUM_THREADS=1 and pins nothing; here each rank reads its
LOCAL_RANK, takes its core group from CPUOPT_RANK_CORES ("0,1;2,3": groups by local
rank) and restarts itself under ``numactl --physcpubind=CORES --membind=NODE`` (see
``numactl_argv``; or pins itself with sched_setaffinity where numactl is refused), then
runs the script, before torch is imported, so the OpenMP pool starts on the right cores
with OMP_NUM_THREADS threads (set by the launcher to the cores per rank).

Standard library only: this runs before anything else in the rank.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback


def numactl_argv(cores, nodes) -> list[str]:
    """numactl binding a process to its cores and its memory to their NUMA node.

    One node: ``--membind=NODE``. Several (a rank larger than a node): ``--localalloc``,
    each thread's pages on its own node; ``--membind`` to several nodes would fill the
    lowest-numbered one first.
    """
    nodes = [str(n) for n in nodes]
    memory = f"--membind={nodes[0]}" if len(nodes) == 1 else "--localalloc"
    return ["numactl", f"--physcpubind={','.join(map(str, cores))}", memory]


def rank_cores(spec: str, local_rank: int) -> list[int]:
    groups = [g for g in spec.split(";") if g]
    if local_rank >= len(groups):
        raise SystemExit(f"cpuopt rank_exec: local rank {local_rank} has no core group in CPUOPT_RANK_CORES={spec!r}")
    return [int(c) for c in groups[local_rank].split(",")]


def run_script(argv: list[str]) -> int:
    """Run the script as __main__; then leave at once, with its exit code.

    Leaving through os._exit skips the interpreter's teardown, where a gloo thread of a
    rank pinned to few cores can still be joinable: seen here as "terminate called without
    an active exception" (SIGABRT) in about one exit in four, after training had finished.
    """
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("usage: python -m cpuopt_helpers.rank_exec SCRIPT.py [ARGS...]")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    spec = os.environ.pop("CPUOPT_RANK_CORES", None)
    if spec:
        cores = rank_cores(spec, local_rank)
        os.environ["CPUOPT_CORES"] = ",".join(map(str, cores))
        nodes = os.environ.get("CPUOPT_RANK_NODES", "").split(";")
        if os.environ.get("CPUOPT_PINNING") == "numactl" and local_rank < len(nodes) and nodes[local_rank]:
            # numactl binds memory too; it runs this module again, which then only runs the script
            argv_exec = numactl_argv(cores, nodes[local_rank].split(",")) + [
                sys.executable, "-m", "cpuopt_helpers.rank_exec", *argv]
            os.execvp(argv_exec[0], argv_exec)
        os.sched_setaffinity(0, cores)
        os.environ["CPUOPT_PINNING"] = "sched_setaffinity"
    return run_script(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
