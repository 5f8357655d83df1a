"""`cpuopt launch -- COMMAND`: plans for any script, real instances, per-instance logs.

Plans and bad input are checked in-process through ``cli.main`` (fast); real instances, and the
bad input once more as the command a user types, start processes (slow).
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cpuopt_helpers import cli, system

XEON = Path(__file__).parent / "fixtures" / "lscpu_p_xeon_2s_smt.txt"
needs_autogroup = pytest.mark.skipif(
    not os.path.exists("/proc/self/autogroup")
    or Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() != "1",
    reason="no autogroup scheduling on this kernel")
SCRIPT = "import os; print('AFFINITY', sorted(os.sched_getaffinity(0)), 'PRELOAD', os.environ.get('LD_PRELOAD'))"


def launch(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "cpuopt_helpers", "launch", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_dry_run_preloads_the_versioned_jemalloc(capsys):
    lib = system.locate_library("jemalloc")
    if lib is None:
        pytest.skip("jemalloc not installed here (make setup installs it as root)")
    assert cli.main(["launch", "--allocator", "jemalloc", "--dry-run", "--", "python", "train.py"]) == 0
    out = capsys.readouterr().out
    assert f"LD_PRELOAD={lib}" in out and out.strip().endswith("python train.py")


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_real_instances_print_their_affinity_and_preload(tmp_path):
    lib = system.locate_library("tcmalloc")
    args = ["--ninstances", "2", "--log-dir", str(tmp_path)] + (["--allocator", "tcmalloc"] if lib else [])
    proc = launch(*args, "--", sys.executable, "-c", SCRIPT)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if "AFFINITY" in line)
    assert len(lines) == 2 and lines[0].startswith("[0] ") and lines[1].startswith("[1] ")
    cores = [line.split("AFFINITY ")[1].split(" PRELOAD")[0] for line in lines]
    assert cores[0] != cores[1] and all(c.count(",") == 0 for c in cores)  # one core each, disjoint
    if lib:
        assert all(line.endswith(lib) for line in lines)
    for i in range(2):
        assert "AFFINITY" in (tmp_path / f"instance_{i}.log").read_text()


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_failing_instance_is_reported_and_the_other_stopped(tmp_path):
    script = ("import os, sys, time\n"
              "sys.exit(3) if os.environ['CPUOPT_INSTANCE'] == '1' else time.sleep(60)")
    proc = launch("--ninstances", "2", "--log-dir", str(tmp_path), "--", sys.executable, "-c", script)
    assert proc.returncode == 1
    assert "instance 1 failed with exit code 3; the other instances were stopped" in proc.stderr
    assert "instance 0 on cores" in proc.stderr and "exit code -15" in proc.stderr


BAD_INPUT = [
    ([], "no command given"),
    (["--cores", "0-1", "--ninstances", "3", "--", "true"], "do not split evenly"),
    (["--allocator", "hoard", "--", "true"], "unknown allocator"),
    (["--affinity", "diagonal", "--", "true"], "unknown affinity"),
    (["--topology", __file__, "--dry-run", "--", "true"], "is not lscpu -p's"),
    (["--topology", str(XEON), "--", "true"], "add --dry-run"),
    (["--topology", str(XEON), "--ninstances", "3", "--ncores-per-instance", "18", "--dry-run", "--", "true"],
     "do not fit in the NUMA nodes"),
]


@pytest.mark.parametrize("args,needle", BAD_INPUT)
def test_bad_launch_input_exits_2(args, needle, capsys):
    assert cli.main(["launch", *args]) == 2
    out, err = capsys.readouterr()
    assert needle in err and len(err.strip().splitlines()) == 1 and out == ""


@pytest.mark.slow
def test_bad_launch_input_from_the_command_line_exits_2():
    for args, needle in BAD_INPUT:
        proc = launch(*args)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
            (args, proc.stderr)


def test_dry_run_on_a_2x28_xeon_puts_each_instance_in_one_socket(capsys):
    args = ["launch", "--topology", str(XEON), "--ninstances", "4", "--dry-run", "--", "python", "train.py"]
    assert cli.main(args) == 0
    header, *lines, wait = capsys.readouterr().out.splitlines()
    assert header.startswith(f"# planned for {XEON}: 2 socket(s)") and wait == "wait" and len(lines) == 4
    for line, node in zip(lines, (0, 0, 1, 1)):
        words = shlex.split(line)
        cores = [int(c) for c in words[words.index("numactl") + 1].split("=")[1].split(",")]
        assert len(cores) == 14 and {c // 28 for c in cores} == {node}  # socket 0: CPUs 0-27, socket 1: 28-55
        assert words[words.index("numactl") + 2] == f"--membind={node}" and words[-3:] == ["python", "train.py", "&"]


@pytest.mark.slow
@needs_autogroup
def test_an_instance_in_its_own_session_keeps_the_launchers_niceness(tmp_path):
    """Each instance runs in its own session, which autogroup scheduling weighs at nice 0 whatever
    its processes' nice: the launcher hands its own on (`nice make test`'s second half)."""
    proc = subprocess.run(["nice", "-n", "7", sys.executable, "-m", "cpuopt_helpers", "launch", "--log-dir",
                           str(tmp_path), "--", "sh", "-c", "sleep 1; cat /proc/self/autogroup"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    expected = min(19, os.nice(0) + 7)  # nice adds to this process's own (make test runs this half at 19)
    assert f"nice {expected}" in proc.stdout, proc.stdout


@needs_autogroup
def test_make_tests_low_priority_half_runs_in_a_session_at_nice_19_and_keeps_its_exit_status():
    script = Path(__file__).resolve().parents[1] / "scripts" / "low-priority.sh"
    session = f"{sys.executable} -c 'import os; print(os.getsid(0))'"
    proc = subprocess.run(["bash", str(script), "sh", "-c", f"cat /proc/self/autogroup; nice; {session}; exit 3"],
                          capture_output=True, text=True, timeout=60)
    group, nice, sid = proc.stdout.splitlines()
    assert proc.returncode == 3 and group.endswith("nice 19") and nice == "19", proc.stdout
    assert int(sid) != os.getsid(0)  # a session of its own: its group's nice leaves this session's alone


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_termination_stops_the_instances_as_ctrl_c_does(sig, tmp_path):
    """`timeout`, `kill`, a cancelled CI job: the instances run in sessions of their own, so only
    cpuopt can stop them, and it does (under `nohup` a SIGHUP stays ignored: the next test)."""
    import signal
    import time

    marker = tmp_path / "alive"
    script = f"import pathlib, time\npathlib.Path({str(marker)!r}).write_text('x')\ntime.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-m", "cpuopt_helpers", "launch", "--log-dir", str(tmp_path), "--",
                             sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_signals)  # as from a terminal, though these tests run under nohup
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the instance never started"
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + getattr(signal, sig) and "interrupted; its workers are stopped" in err, err
    time.sleep(0.5)
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(marker).encode() in _cmdline(p)]
    assert not left, "an instance outlived cpuopt"


@pytest.mark.slow
def test_a_worker_ends_with_a_launcher_killed_outright():
    """`kill -9`, the OOM killer, a notebook kernel that died: the launcher cannot stop its workers, which
    run in sessions of their own, so each worker asked Linux to end it with its launcher."""
    import time

    proc = subprocess.Popen([sys.executable, "-m", "cpuopt_helpers", "bench", "--workload", "cnn", "--steps", "99999",
                             "--warmup", "0", "--timeout", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers, deadline = [], time.monotonic() + 120
    while not workers and time.monotonic() < deadline:
        time.sleep(0.2)
        workers = [p for p in Path("/proc").iterdir() if p.name.isdigit()
                   and b"cpuopt_helpers.worker" in _cmdline(p) and b"99999" in _cmdline(p)]
    assert workers, "the worker never started"
    time.sleep(2)  # past its start, where it asks
    assert not _alive_after_killing(proc, workers), "a worker outlived its launcher"


def _alive_after_killing(proc: subprocess.Popen, started: list[Path]) -> list[Path]:
    """Kill ``proc`` outright (SIGKILL: nothing of it runs after) and give Linux 30 s to end what it
    started: those still running then."""
    import signal
    import time

    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(_cmdline(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in started if _cmdline(p)]


@pytest.mark.slow
def test_a_launched_program_ends_with_cpuopt_killed_outright(tmp_path):
    """Your program under `cpuopt launch` runs in a session of its own: killed outright, cpuopt cannot
    stop it, so Linux ends it (launch.ending_with_this). Without the guard it sleeps on for a minute."""
    import time

    marker = tmp_path / "alive"
    script = f"import pathlib, time\npathlib.Path({str(marker)!r}).write_text('x')\ntime.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-m", "cpuopt_helpers", "launch", "--log-dir", str(tmp_path), "--",
                             sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the instance never started"
    programs = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(marker).encode() in _cmdline(p)]
    assert programs and all(b"prctl" not in _cmdline(p) for p in programs)  # the guard became the program
    assert not _alive_after_killing(proc, programs), "the program outlived cpuopt launch"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard is Linux's PR_SET_PDEATHSIG")
def test_a_guarded_program_that_does_not_exist_says_so_and_exits_127():
    from cpuopt_helpers import launch

    proc = subprocess.run(launch.ending_with_this(["no-such-program-here", "--flag"]), capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 127 and proc.stderr.strip() == (
        "cpuopt: cannot run no-such-program-here: No such file or directory"), proc.stderr
    echo = subprocess.run(launch.ending_with_this(["echo", "a b", "--c"]), capture_output=True, text=True, timeout=30)
    assert echo.returncode == 0 and echo.stdout == "a b --c\n"  # its arguments as given


@pytest.mark.slow
def test_an_interrupted_workbook_run_stops_its_notebooks_workers(tmp_path):
    """SIGTERM (or Ctrl-C) to `cpuopt workbook run`: the notebook stops, and so do the kernel and the
    workers it started (found by the build folder they inherit), none measuring on into the next run."""
    import signal
    import time

    mark = f"CPUOPT_BUILD={tmp_path}".encode()
    proc = subprocess.Popen([sys.executable, "-m", "cpuopt_helpers", "workbook", "run", "--only", "01", "--preset",
                             "quick", "--out", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_signals)
    deadline = time.monotonic() + 180
    while not [p for p in _ours(mark) if b"cpuopt_helpers.worker" in _cmdline(p)]:
        assert time.monotonic() < deadline and proc.poll() is None, "no worker started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "interrupted" in err, err
    deadline = time.monotonic() + 15
    while _ours(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [_cmdline(p)[:80] for p in _ours(mark)], "a kernel or worker outlived the interrupted workbook"


def _ours(mark: bytes) -> list[Path]:
    """The processes whose environment holds ``mark``."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and mark in (p / "environ").read_bytes().split(b"\0"):
                found.append(p)
        except OSError:
            pass
    return found


def _cmdline(proc_dir: Path) -> bytes:
    try:
        return (proc_dir / "cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.slow
def test_under_nohup_a_closed_terminal_does_not_stop_the_run(tmp_path):
    import signal
    import time

    marker = tmp_path / "alive"
    script = f"import pathlib, time\npathlib.Path({str(marker)!r}).write_text('x')\ntime.sleep(2)"
    proc = subprocess.Popen(["nohup", sys.executable, "-m", "cpuopt_helpers", "launch", "--log-dir", str(tmp_path),
                             "--", sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "interrupted" not in err, err


def _default_signals() -> None:
    import signal

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
