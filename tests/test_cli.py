"""The `cpuopt` command as a user runs it: exit codes, one-line errors, JSON results.

Bad input is checked in-process through ``cli.main`` (fast) and, all of it once more, as the
command a user types (slow: one process per input); every bench starts worker processes (slow).
"""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpuopt_helpers import cli, system

XEON = Path(__file__).parent / "fixtures" / "lscpu_p_xeon_2s_smt.txt"


def cpuopt(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "cpuopt_helpers", *args], capture_output=True, text=True,
                          timeout=timeout)


BAD_INPUT = [
    (["bench", "--batch-size", "0"], "batch size must be a positive integer"),
    (["bench", "--workload", "nosuch"], "unknown workload 'nosuch'"),
    (["bench", "--threads", "4096"], "logical cores"),
    (["bench", "--instances", "4096"], "instances"),
    (["bench", "--allocator", "hoard"], "unknown allocator"),
    (["bench", "--workload", "not_a_module_xyz:build"], "cannot import"),
    (["bench", "--steps", "many"], "invalid int value"),
    (["bench", "--kmp-blocktime", "0"], "--omp-runtime intel"),
    (["workbook", "run", "--only", "77"], "no notebook numbered 77"),
    (["workbook", "run", "--preset", "huge"], "unknown preset"),
    (["workbook", "run", "--workloads", "cnn,nosuch"], "unknown workload 'nosuch'"),
    (["workbook", "run", "-p", "rounds", "3"], "UPPER_CASE"),
    (["frobnicate"], "invalid choice"),
    (["bench", "--topology", "/nonexistent/server.json", "--dry-run"], "cannot read topology file"),
    (["bench", "--topology", str(XEON)], "--topology plans for another machine: add --dry-run"),
    (["bench", "--topology", str(Path(__file__)), "--dry-run"], "is not lscpu -p's"),
    (["tune", "--topology", str(XEON)], "add --dry-run"),
    (["tune", "--topology", "/nonexistent/server.json", "--dry-run"], "cannot read topology file"),
    (["bench", "--no-trace-shapes"], "only applies with --trace"),
    (["bench", "--dry-run", "--trace", "/nonexistent/dir/x.json"], "cannot write"),  # as a real run would
    (["profile", "--preset", "standard", "x.log"], "--preset is for --whole-step"),
    (["profile", "--roofline", "r.json", "x.log"], "--roofline is for --whole-step"),
    (["profile", "--whole-step", "--preset", "huge", "x.json"], "unknown preset 'huge'"),
]


@pytest.mark.parametrize("args,needle", BAD_INPUT)
def test_bad_input_exits_2_with_one_line(args, needle, capsys, caplog):
    caplog.set_level(logging.WARNING)
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpuopt: error:") and needle in lines[0]
    assert out == "" and not caplog.records  # no warning logged before the error either


@pytest.mark.slow
def test_bad_input_from_the_command_line_exits_2_with_one_line():
    for args, needle in BAD_INPUT:
        proc = cpuopt(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("cpuopt: error:") and needle in lines[0], (args, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stdout == "", (args, proc.stderr)


def test_dry_run_prints_a_plan_and_runs_nothing(capsys):
    assert cli.main(["bench", "--threads", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "OMP_NUM_THREADS=1" in out and "cpuopt_helpers.worker" in out


@pytest.mark.slow
def test_bench_json_prints_an_ok_run_result():
    proc = cpuopt("bench", "--workload", "cnn", "--preset", "quick", "--steps", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    for key in ("config", "config_hash", "status", "reason", "samples_per_s", "step_ms", "peak_rss_mb",
                "loss_first", "loss_last", "achieved_gflops", "instances", "env", "argv", "versions", "system",
                "created_at"):
        assert key in r
    assert r["status"] == "ok" and r["samples_per_s"] > 0 and r["system"] == system.collect_facts().fingerprint


@pytest.mark.slow
def test_a_kernel_that_fell_back_is_in_the_result_and_its_words():
    """Forced, not waited for: no C++ compiler for Inductor, so fused Lamb runs eager, and says so."""
    args = ["bench", "--workload", "cnn", "--preset", "quick", "--optimizer", "lamb", "--optimizer-impl", "fused",
            "--steps", "1", "--warmup", "1", "--env", "CXX=/bin/false", "--env", "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1"]
    proc = cpuopt(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    fell, = json.loads(proc.stdout)["fallbacks"]
    assert (fell["what"], fell["fell_back_to"]) == ("fused Lamb", "eager") and "compiler" in fell["reason"]
    text = cpuopt(*args).stdout
    assert "fell back: fused Lamb ran eager (" in text


@pytest.mark.slow
@pytest.mark.parametrize("scope, what", [("model", "the model"), ("step", "the step's forward and loss")])
def test_a_compiled_run_that_ran_eager_says_so(scope, what):
    """Forced, not waited for: TORCH_COMPILE_DISABLE makes torch.compile a no-op, silently (a user's shell
    may set it); the run's fallbacks say the compiled callable ran eager. (Compiled runs that say nothing:
    test_measuring's, one a scope.)"""
    args = ["bench", "--workload", "cnn", "--preset", "quick", "--compile", "default", "--compile-scope", scope,
            "--steps", "1", "--warmup", "1", "--json"]
    off = cpuopt(*args, "--env", "TORCH_COMPILE_DISABLE=1")
    assert off.returncode == 0, off.stderr
    fell, = json.loads(off.stdout)["fallbacks"]
    assert fell["what"] == f"torch.compile ({what})" and fell["fell_back_to"] == "eager"
    assert "TORCH_COMPILE_DISABLE" in fell["reason"]

@pytest.mark.slow
def test_a_run_that_times_out_says_the_throughput_it_reached():
    # 30 s: at nice 19 beside the notebook tests, 12 s once ended before the first timed step (a fresh-clone make test, 2026-12-03)
    proc = cpuopt("bench", "--workload", "cnn", "--preset", "quick", "--steps", "100000", "--timeout", "30", "--json")
    r = json.loads(proc.stdout)
    assert proc.returncode == 1 and r["status"] == "timeout" and "reached_steps" in r, r["reason"]
    assert r["reached_samples_per_s"] > 0 and r["reached_steps"] >= 1
    assert f"it reached {r['reached_samples_per_s']:.2f} samples/s over {r['reached_steps']} timed step" in r["reason"]


@pytest.mark.slow
def test_bench_tcmalloc_shows_the_preload():
    lib = system.locate_library("tcmalloc")
    if lib is None:
        pytest.skip("tcmalloc not installed here (make setup installs it as root)")
    r = json.loads(cpuopt("bench", "--allocator", "tcmalloc", "--steps", "3", "--json").stdout)
    assert r["status"] == "ok" and r["env"]["LD_PRELOAD"] == lib


@pytest.mark.slow
def test_bench_two_instances_text_output():
    proc = cpuopt("bench", "--instances", "2", "--threads", "1", "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    assert "instance 0: cores 0 (numactl)" in proc.stdout and "instance 1: cores 1 (numactl)" in proc.stdout


@pytest.mark.slow
def test_failed_run_exits_1():
    proc = cpuopt("bench", "--workload", "tests.user_workloads:crash", "--steps", "2")
    assert proc.returncode == 1 and "deliberate crash" in proc.stdout


def test_workbook_run_passes_workloads_and_parameters_to_every_notebook(monkeypatch, capsys, tmp_path):
    from datetime import datetime, timezone

    from cpuopt_helpers import report, workbook
    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.results import ResultStore, build_dir

    monkeypatch.setenv("CPUOPT_BUILD", str(tmp_path))  # the run's store: this test's own
    seen = {}

    def run_workbook(**kw):  # one run lands in the run's store, measured on a loaded machine
        seen.update(kw)
        config = RunConfig(workload="cnn")
        ResultStore(build_dir() / "results.sqlite").save_result(
            {"config": config.to_dict(), "config_hash": config.config_hash(), "status": "ok", "system": "m",
             "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "machine_state": {"loaded": True, "steal_pct": 9.0}})
        return []

    monkeypatch.setattr(workbook, "run_workbook", run_workbook)
    monkeypatch.setattr(report, "build_report", lambda out, facts: "report.html")
    args = ["workbook", "run", "--workloads", "cnn,tests.user_workloads:dict_model", "-p", "ROUNDS", "3",
            "-p", "COMPILE_MODES", '["default"]', "-p", "RESUME", "False", "-p", "BUDGET_MIN", "0.5", "--only", "01,03", "--only", "05"]
    assert cli.main(args) == 0
    assert "The machine was busy with other work: 1 of 1 runs" in capsys.readouterr().out  # why it took longer
    assert seen["parameters"] == {"WORKLOADS": ["cnn", "tests.user_workloads:dict_model"],
                                  "ROUNDS": 3, "COMPILE_MODES": '["default"]', "RESUME": False, "BUDGET_MIN": 0.5}
    assert seen["only"] == ["01", "03", "05"]


def test_list_parameters_read_what_papermill_hands_over():
    from cpuopt_helpers.errors import CpuoptError
    from cpuopt_helpers.session import parameter_list

    assert parameter_list(["cnn"]) == parameter_list('["cnn"]') == parameter_list("cnn") == ["cnn"]
    assert parameter_list(" cnn , mypkg.m:build ") == ["cnn", "mypkg.m:build"]
    assert parameter_list("[16, 64]", int) == parameter_list("16,64", int) == parameter_list((16, 64), int) == [16, 64]
    assert parameter_list(7, int) == [7] and parameter_list("") == []
    with pytest.raises(CpuoptError, match="JSON list"):
        parameter_list('["cnn"')
    with pytest.raises(CpuoptError, match="must be of type int"):
        parameter_list("16,many", int)


@pytest.mark.slow
def test_the_cpuopt_script_finds_a_users_module_in_the_current_folder(tmp_path):
    """As docs/own-model.md says: from the folder that holds it, with the installed `cpuopt` script (which,
    unlike `python -m`, does not put the current folder on the import path)."""
    from pathlib import Path

    (tmp_path / "mymodel.py").write_text((Path(__file__).parent / "user_workloads.py").read_text())
    script = Path(sys.executable).parent / "cpuopt"
    if not script.exists():
        pytest.skip("no installed cpuopt script beside this Python")
    proc = subprocess.run([str(script), "bench", "--workload", "mymodel:dict_model", "--steps", "2", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert json.loads(proc.stdout)["status"] == "ok"


def test_a_parameter_no_notebook_takes_is_refused_before_anything_runs(capsys):
    from cpuopt_helpers import workbook

    assert cli.main(["workbook", "run", "--preset", "quick", "--only", "01,07", "-p", "ROUNS", "3"]) == 2
    err = capsys.readouterr().err
    assert "no notebook among 01, 07 takes the parameter ROUNS; they take" in err and "ROUNDS" in err
    books = {b.name[:2]: b for b in workbook.list_notebooks()}
    assert "WORKLOADS" in workbook.declared_parameters(books["07"])  # 07 takes a list of workloads too
    assert all(workbook.declared_parameters(b)[0] == "PRESET" for b in books.values())
    with pytest.raises(Exception, match="notebook 08 has no parameter ROUNDS"):
        workbook.check_parameters([books["08"]], {}, {"08": {"ROUNDS": 1}})


def test_bench_dry_run_for_a_server_from_its_saved_doctor_json(tmp_path, capsys):
    topo = system.read_topology_file(str(XEON))[0]
    saved = tmp_path / "server.json"
    saved.write_text(json.dumps({"topology": topo.to_dict(), "allocators": {"jemalloc": "/srv/libjemalloc.so.2"},
                                 "openmp": {"intel": None}, "numactl": {"present": True, "works": True}}))
    args = ["bench", "--topology", str(saved), "--instances", "2", "--allocator", "jemalloc", "--dry-run"]
    assert cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"# planned for {saved}: 2 socket(s), 2 NUMA node(s), 56 physical / 112 logical CPUs usable"
    assert "--physcpubind=" + ",".join(map(str, range(28))) + " --membind=0 " in lines[1]
    assert "--physcpubind=" + ",".join(map(str, range(28, 56))) + " --membind=1 " in lines[2]
    assert all("LD_PRELOAD=/srv/libjemalloc.so.2" in line for line in lines[1:3])


@pytest.mark.slow
@pytest.mark.skipif(1 not in os.sched_getaffinity(0), reason="needs CPU 1")
def test_under_taskset_doctor_and_bench_use_the_one_cpu_left():
    doctor = subprocess.run(["taskset", "-c", "1", sys.executable, "-m", "cpuopt_helpers", "doctor", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert doctor.returncode == 0, doctor.stderr
    facts = json.loads(doctor.stdout)
    assert facts["usable_cpus"] == 1 and facts["topology"]["usable"] == [1]
    bench = subprocess.run(["taskset", "-c", "1", sys.executable, "-m", "cpuopt_helpers", "bench", "--workload", "cnn",
                            "--preset", "quick", "--steps", "3", "--json"], capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0, bench.stderr
    (inst,) = json.loads(bench.stdout)["instances"]
    assert inst["affinity"] == [1] and inst["torch_threads"] == 1 and inst["omp_num_threads"] == "1"


def test_tables_and_stops_are_printed_as_people_read_them(capsys):
    """`cpuopt profile`'s tables give shares as percentages and times to 0.01 ms; `cpuopt compare`
    says why its rounds stopped in words (--json keeps the raw values)."""
    import pandas as pd

    table = pd.DataFrame({"calls": [98], "time_ms": [576.58601], "share": [0.72371]}, index=["reorder"])
    shown = cli.readable(table)
    assert shown.loc["reorder", "share"] == "72%" and shown.loc["reorder", "time_ms"] == 576.59
    result = {"ratio": 1.0, "ci_low": 0.9, "ci_high": 1.1, "n": 14, "verdict": "no different", "label": "95% CI",
              "order": ["AB"] * 14, "stopped": "max_rounds", "failures": [], "failed_rounds": 0}
    cli.report_comparison(result, "a test", as_json=False)
    assert "; stopped at --max-rounds" in capsys.readouterr().out


def test_bench_says_which_window_each_rate_is_over_and_no_percentiles_from_two_steps():
    """The run's rate is over the timed window, an instance's over its steps alone (between them,
    a little time the window includes); p10 and p90 of two steps are not said."""
    result = {"status": "ok", "label": "cnn[quick]", "samples_per_s": 328.5, "achieved_gflops": 1.8,
              "step_ms": {"median": 48.6, "p10": 21.1, "p90": 76.1, "n": 2},
              "phase_ms": {"forward": 40.4, "backward": 7.7, "optimizer": 0.5}, "peak_rss_mb": 320.0,
              "loss_first": 2.4, "loss_last": 2.0, "startup_s": 3.2, "warnings": [],
              "instances": [{"index": 0, "cores": [0, 1], "pinned_by": "numactl", "torch_threads": 2,
                             "samples_per_s": 329.2, "ld_preload": ""}]}
    text = cli.format_result(result)
    assert "328.5 samples/s over the timed window, step 48.60 ms (n=2)" in text and "p10" not in text
    assert "instance 0: cores 0-1 (numactl), 2 threads, 329.2 samples/s over its steps alone" in text
    result["step_ms"] = dict(result["step_ms"], n=6)
    assert "(p10 21.10, p90 76.10, n=6)" in cli.format_result(result)


def test_launch_takes_torchruns_and_run_cpus_spellings():
    """torchrun takes --nproc_per_node as well as --nproc-per-node; run_cpu names its cores
    --core-list and its logs --log-path: cpuopt launch takes them all, to the same options."""
    parser = cli.build_parser()
    args = parser.parse_args(["launch", "--nproc_per_node", "2", "--node_rank", "0", "--rdzv_endpoint", "h:1",
                              "--ncores_per_instance", "1", "--core-list", "0-1", "--log-path", "logs", "--", "x"])
    assert (args.nproc_per_node, args.node_rank, args.rdzv_endpoint) == (2, "0", "h:1")
    assert (args.ncores_per_instance, args.cores, args.log_dir) == (1, "0-1", "logs")
    assert cli.spellings("--nnodes") == ["--nnodes"]  # one word: one spelling
