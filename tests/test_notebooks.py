"""Notebooks executed headless with papermill on the quick preset; recorded values checked."""

import json
import os
import re
from pathlib import Path

import nbformat
import pytest

from cpuopt_helpers import workbook
from cpuopt_helpers.results import ResultStore

pytestmark = pytest.mark.slow


def outputs_text(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    chunks = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            chunks.append(out.get("text", "") or json.dumps(out.get("data", {})))
    return "\n".join(chunks)


# Each notebook executes once per `make test`: 00 through nbval (its NBVAL_CHECK_OUTPUT cell is
# compared with the committed output; `make test` names it before tests/ so it runs first and
# leaves the roofline in the store), 01-09 here through papermill on the quick preset, made
# smaller still where that loses no code path: the sweeps of 03-06 on the CNN only (02's profiles
# on the CNN and the RNN), one baseline round, one launcher round, five kernel-benchmark rounds
# (intervals for the interval check to read), confirmations of one round (BUDGET_MIN 0.2): all
# end in "too few rounds", the verdict path the unit tests of compare.py cover in full; shorter
# trainings (fewer epochs, two global batches in 07, two timed steps a RetinaNet run in 08),
# one replay repeat per primitive in 02 and 08;
# 05 with two optimizer arms (foreach SGD, fused AdamW: each code path once) and without zentorch
# (a second cold compile on an AMD CPU; tests/test_zentorch.py covers its findings); 08 as the standard
# preset runs it (no 601-class discrepancy) with a climb of RetinaNet over one rung (the paper's
# fixes: screening, a confirmation, the top against the defaults in one round and the ladder it
# writes; every rung is the same code, and tests/test_ladder.py climbs them all with made-up
# speeds); 06's digits experiment over one epoch; 02's bf16 profile only where bf16 has a fast
# path (SLOW_BF16 = False, as in make run; 06 measures bf16 everywhere). A user workload written
# outside the package (USER: keyword inputs, an output object, batch norm, the fixes declared as options) runs beside
# the built-ins in 01, 02, 06 and 08, and alone in 03 (the threading sweep is the same code for
# every workload; the CNN's would double 03's time).
EXECUTED = [p.name for p in workbook.list_notebooks() if not p.name.startswith("00")]
ONE_ROUND = {"BUDGET_MIN": 0.2}
USER = "tests.user_workloads:tagger"
CNN = {"WORKLOADS": ["cnn"], **ONE_ROUND}
CNN_AND_USER = {"WORKLOADS": ["cnn", USER], **ONE_ROUND}
BASELINE_ROUNDS = 1
PROFILED = ["cnn", USER]  # the RNN and the transformer take no path of their own (the user CNN: mostly outside oneDNN)
TEST_PARAMETERS = {"01": {"ROUNDS": BASELINE_ROUNDS, "WORKLOADS": ["cnn", "transformer", "rnn", USER]},
                   "02": {"WORKLOADS": PROFILED, "REPLAY_REPEATS": 1, "SLOW_BF16": False},
                   "03": {"WORKLOADS": [USER], **ONE_ROUND}, "04": {"LAUNCHER_ROUNDS": 1, **CNN},
                   "05": {"OPTIMIZER_ARMS": ["SGD foreach", "AdamW fused"], "ZENTORCH": False, **CNN},
                   "06": {"ACCURACY_EPOCHS": 1, **CNN_AND_USER},
                   "07": {"MAX_EPOCHS": 3, "GLOBAL_BATCHES": [64, 256], **ONE_ROUND},
                   "08": {"KERNEL_ROUNDS": 5, "WORKLOADS": ["retinanet", USER], "CLIMB_CLASSES": [80], "STEPS": 2,
                          "DISCREPANCY": False,  # as the standard preset (601 classes: make case-study)
                          "PROFILE_REPEATS": 1, "CLIMB_RUNGS": ["case-study fixes"], "FINAL_ROUNDS": 1,
                          **ONE_ROUND},
                   "09": ONE_ROUND}


@pytest.fixture(scope="module")
def quick_run():
    """Notebooks 01-09 on the quick preset, into the test session's build folder (and 00 too
    when this session did not run it through nbval, e.g. `pytest tests/test_notebooks.py`)."""
    out = Path(os.environ["CPUOPT_BUILD"])
    books = ([] if (out / "figures" / "00_roofline.png").exists() else ["00_system_check.ipynb"]) + EXECUTED
    report = workbook.run_workbook(preset="quick", only=[n[:2] for n in books], out=str(out), progress=False,
                                   notebook_parameters=TEST_PARAMETERS)
    return out, report


def test_every_notebook_runs_on_the_quick_preset(quick_run):
    out, report = quick_run
    assert [r["notebook"] for r in report if not r["notebook"].startswith("00")] == EXECUTED
    assert all(r["status"] == "ok" for r in report), workbook.format_report(report)
    assert not list(workbook.NOTEBOOKS.glob("kernel-*")), "kernel sockets left beside the notebooks"
    for r in report:
        assert (out / "notebooks" / r["notebook"]).exists()
        text = (out / "notebooks" / r["notebook"]).read_text()
        assert "TqdmWarning" not in text and not any(f"{u}/s]" in text for u in ("it", "run", "round")), (
            f"{r['notebook']}: progress bars left in the executed notebook (progress.bar)")


def test_system_check_records_the_roofline(quick_run):
    out, _ = quick_run
    store = ResultStore(out / "results.sqlite")
    from cpuopt_helpers import system

    roof = store.get_fact(system.collect_facts().fingerprint, "roofline/quick")
    assert roof["gemm_gflops_best"] > 1 and roof["copy_gbs_best"] > 0.1
    assert (out / "figures" / "00_roofline.png").stat().st_size > 1000
    assert roof.get("gemm_gflops_bf16_best") is None or roof["gemm_gflops_bf16_best"] > 0
    assert roof["clock_source"] and (roof["clock_ghz"] is None or 0.5 < roof["clock_ghz"] < 7)  # the peak's clock


def test_baseline_measures_every_workload_and_hands_on(quick_run):
    out, _ = quick_run
    store = ResultStore(out / "results.sqlite")
    df = store.load(tag="01_baseline")
    assert set(df.workload) == {"cnn", "transformer", "rnn", USER}
    assert (df.status == "ok").all() and (df.samples_per_s > 0).all()
    assert df.groupby("workload").size().min() == BASELINE_ROUNDS
    from cpuopt_helpers import system

    machine = system.collect_facts().fingerprint
    ladder = store.get_fact(machine, "ladder/cnn/quick")
    assert ladder[0]["step"] == "baseline"
    # the notebook's answer is worded from the stored numbers
    text = outputs_text(out / "notebooks" / "01_baseline.ipynb")
    median = df[df.workload == "cnn"].samples_per_s.median()
    assert f"cnn: {median:.1f} samples/s" in text
    assert (out / "figures" / "01_baseline.png").stat().st_size > 1000


def test_a_failing_notebook_is_reported_and_the_others_still_run(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    for name, source in (("00_fails.ipynb", "raise ValueError('broken cell')"), ("01_passes.ipynb", "print('fine')")):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell("PRESET = 'quick'"), nbformat.v4.new_code_cell(source)]
        nb.cells[0].metadata["tags"] = ["parameters"]
        nbformat.write(nb, folder / name)
    report = workbook.run_workbook(preset="quick", out=str(tmp_path / "out"), progress=False, folder=folder)
    assert [r["status"] for r in report] == ["failed", "ok"]
    assert "ValueError: broken cell" in report[0]["error"] and "cell" in report[0]["error"]
    assert "1 notebook(s) passed, 1 failed" in workbook.format_report(report)


def test_profiling_breaks_down_projects_and_compares(quick_run):
    out, _ = quick_run
    from cpuopt_helpers import profiledn, system

    store = ResultStore(out / "results.sqlite")
    prof = store.get_fact(system.collect_facts().fingerprint, "profile/cnn/quick")
    assert 0 < prof["coverage"] <= 1.0 and prof["efficiency"] > 0 and prof["replayed"] > 0
    log = profiledn.parse_log(out / "onednn_logs" / "cnn_quick.log")
    conv = log.exec[log.exec.kind == "convolution"]
    assert set(conv.direction) == {"forward", "backward_data", "backward_weights"}
    from cpuopt_helpers import runtimes

    ipex = runtimes.ipex_facts()["available"]
    bf16 = system.collect_facts().bf16["accelerated"]  # profiled in bf16 only where it has a fast path (SLOW_BF16)
    figures = ["02_kinds", "02_directions", "02_projection", "02_kernel_roofline", "02_step_composition",
               "02_compare_cnn_channels_last"] + (["02_compare_cnn_bf16"] if bf16 else []) + (
               ["02_compare_cnn_torch_2_8_IPEX"] if ipex else [])
    for name in figures:
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000
    text = outputs_text(out / "notebooks" / "02_profiling.ipynb")
    assert f"efficiency ratio {prof['efficiency']:.0%}" in text  # the answer quotes the stored numbers
    assert "cnn, default vs channels_last: measured step" in text
    assert ("cnn, fp32 vs bf16: measured step" in text) == bf16
    assert bf16 or "cnn: not compared in bf16: this CPU has no bf16 fast path" in text  # SLOW_BF16 = False
    assert ("cnn torch_2.8, torch_2.8 vs torch_2.8_IPEX: measured step" in text) == ipex
    assert ipex or "cnn: not compared with IPEX" in text
    # verbose-logged, profiler-traced and light-traced runs per workload (the plain step is 01's
    # baseline run, reused), plus plain and logged in channels-last and in bf16, and both IPEX runtime profiles
    assert len(store.load(tag="02_profiling")) == len(PROFILED) * 3 + 2 + (2 if bf16 else 0) + (4 if ipex else 0)
    assert "(Times from a trace without shapes" in text  # the whole step's times come from the light trace
    assert "not profiled" not in text
    assert 0 <= prof["trace_outside_onednn"] <= 1 and prof["ops_per_step"] > 10
    assert (out / "onednn_logs" / "cnn_quick.trace.json").exists()
    assert (out / "figures" / "02_trace_top_ops.png").stat().st_size > 1000


def machine_id():
    from cpuopt_helpers import system

    return system.collect_facts().fingerprint


def test_threading_sweeps_and_hands_on_a_measured_choice(quick_run):
    out, _ = quick_run
    store = ResultStore(out / "results.sqlite")
    df = store.load(tag="03_threading")
    assert set(df["config.workload"]) == {USER} and (df.status == "ok").all()
    assert {"threads=1", "affinity=none", "oversubscribe=True", "loader_workers=1"} <= {
        part for label in df.label for part in label.split()}
    ladder = store.get_fact(machine_id(), f"ladder/{USER}/quick")
    assert [s["step"] for s in ladder][:2] == ["baseline", "threading"]
    text = outputs_text(out / "notebooks" / "03_threading.ipynb")
    sentence = ladder[1]["evidence"]["sentence"]
    assert sentence in text  # what was handed on is what the notebook said
    from cpuopt_helpers import system

    baseline = dict(ladder[0]["config"])
    baseline["threads"] = baseline["threads"] or system.topology().physical_cores
    assert ("handed on" in sentence) == (ladder[1]["config"] != baseline)  # a kept baseline is the baseline
    for name in ("03_scaling", "03_settings"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000


def test_allocators_and_launchers_compared(quick_run):
    out, _ = quick_run
    store = ResultStore(out / "results.sqlite")
    df = store.load(tag="04_allocator")
    assert (df.status == "ok").all()
    allocators = set(df["config.allocator"])
    assert "default" in allocators and len(allocators) >= 2
    launchers = store.load(tag="04_launchers")
    assert "run_cpu" in set(launchers["config.launcher"]) and (launchers.status == "ok").all()
    text = outputs_text(out / "notebooks" / "04_allocator.ipynb")
    assert "run_cpu's log of its choices" in text and "run_cpu's defaults over PyTorch's defaults: " in text
    for name in ("04_allocators", "04_launchers"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000


def test_bf16_measured_with_accuracy_and_a_computed_choice(quick_run):
    from cpuopt_helpers.decisions import Finding

    out, _ = quick_run
    store = ResultStore(out / "results.sqlite")
    df = store.load(tag="06_bf16")
    assert {"fp32", "bf16"} <= set(df["config.dtype"]) and df.status.isin(["ok", "unsupported"]).all()
    assert (df[df["config.dtype"] == "fp32"].status == "ok").all()  # only bf16 may lack a kernel on this CPU
    text = outputs_text(out / "notebooks" / "06_bf16.ipynb")
    assert "the forward pass produced bfloat16" in text
    rung = [s for s in store.get_fact(machine_id(), "ladder/cnn/quick") if s["step"] == "bf16"]
    handed = "bf16" if rung and rung[-1]["config"]["dtype"] == "bf16" else "fp32"  # what the ladder holds, it says
    assert "digits, bf16 (the loss in fp32): final test accuracy" in text
    kept = store.get_fact(machine_id(), f"findings/bf16/cnn/{'quick' if rung else ''}")  # Session.record's key
    said = Finding.from_dict(kept).sentence  # the choice, said once: its setting, handed on or not
    assert text.count(f"- {said}\n") == 1 and said.endswith("handed on.") == (handed == "bf16")
    # the bf16 log's slowest kernels; on a CPU without a bf16 path, oneDNN may run none at all
    assert "Slowest kernels:" in text or "No oneDNN primitive ran." in text
    for name in ("06_throughput", "06_accuracy"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000


def test_ipex_runtimes_and_upstream_replacements_side_by_side(quick_run):
    from cpuopt_helpers import runtimes, system

    out, _ = quick_run
    store = ResultStore(out / "results.sqlite")
    df = store.load(tag="05_ipex")
    assert (df.status == "ok").all()
    assert "default" in set(df["config.compile"].dropna()) and df["compile_s"].dropna().gt(0).all()
    assert {"foreach", "fused"} <= set(df["config.optimizer_impl"]) and "adamw" in set(df["config.optimizer"])
    text = outputs_text(out / "notebooks" / "05_ipex.ipynb")
    if runtimes.ipex_status()["available"]:
        ipex_rows = df[df["config.ipex"] == True]  # noqa: E712
        assert len(ipex_rows) and all(str(v).startswith("2.8") for v in ipex_rows["versions.ipex"])
        assert all(str(v).startswith("2.8") for v in ipex_rows["versions.torch"])  # in IPEX's own runtime
        assert (ipex_rows.loss_last < ipex_rows.loss_first * 1.5).all()  # it trains
        assert "IPEX over its own stock torch 2.8, in fresh paired rounds:" in text and "over torch 2.8 + IPEX:" in text
        assert "cnn: this torch as notebook 05 hands it on (" in text  # against IPEX, in fresh rounds too
        confirmation = store.load(tag="05_ipex/ipex")  # the fresh rounds: IPEX against its own torch 2.8, and
        arms = set(zip(confirmation["config.runtime"], confirmation["config.ipex"]))  # what 05 hands on against IPEX
        assert arms == {("ipex", False), ("ipex", True), ("main", False)}, arms
    else:
        assert "IPEX runtime skipped:" in text
    assert ("fastest with this torch in screening:" in text or "with this torch no setting outran stock" in text)
    assert "compiled in" in text
    ladder = store.get_fact(system.collect_facts().fingerprint, "ladder/cnn/quick")
    assert "runtime" in [s["step"] for s in ladder]
    assert (out / "figures" / "05_runtimes.png").stat().st_size > 1000


def test_multi_instance_table_ddp_and_convergence(quick_run):
    out, _ = quick_run
    store = ResultStore(out / "results.sqlite")
    df = store.load(tag="07_multi_instance")
    assert (df.status == "ok").all()
    ddp = df[df["config.mode"] == "ddp"]
    assert len(ddp) and ddp["params_in_sync"].all()
    assert {"independent", "ddp"} <= set(df["config.mode"])
    text = outputs_text(out / "notebooks" / "07_multi_instance.ipynb")
    assert "DDP over independent instances at 2 x 1:" in text
    ladder = store.get_fact(machine_id(), "ladder/cnn/quick")
    multi = [s for s in ladder if s["step"] == "multi-instance"]
    assert multi and multi[-1]["evidence"]["sentence"] in text  # what the notebook said is what it handed on
    assert "epochs to 95% test accuracy" in text or "did not reach 95%" in text
    for name in ("07_layouts", "07_convergence"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000


def test_case_study_ladder_frozen_layers_and_kernels(quick_run):
    out, _ = quick_run
    store = ResultStore(out / "results.sqlite")
    df = store.load(tag="08_case_study")
    assert (df.status == "ok").all() and set(df["config.workload"]) == {"retinanet", USER}
    df = df[df["config.workload"] == "retinanet"]
    assert (df.flops_per_step > 1e8).all() and (df.samples_per_s > 0).all()
    assert {"fused", "folded"} <= {json.loads(o or "{}").get("frozen_bn") for o in df["config.options"]}
    assert {"default", "foreach"} <= set(df["config.optimizer_impl"]) and set(df["config.optimizer"]) == {"lamb"}
    text = outputs_text(out / "notebooks" / "08_case_study_retinanet.ipynb")
    assert "all fixes over baseline:" in text
    assert "RetinaNet at 601 classes is not profiled here (DISCREPANCY = False" in text
    assert "backward-weights convolutions per step" in text
    assert "forward + backward" in text and "Lamb on RetinaNet[quick]" in text
    assert "the physical limit; the kernel takes" in text
    assert "fused" in set(df["config.optimizer_impl"]) and "fused Lamb over baseline:" in text
    from tests.test_kernels import cpp_compiler

    fell = [f for r in store.results(tag="08_case_study") for f in r.get("fallbacks") or []]
    # with a compiler, fused Lamb compiles in the worker (its FLOP count's step once made it fall back for good)
    assert cpp_compiler() is None or not [f for f in fell if "no compiled frames" in f["reason"]], fell
    # the climb: its rung screened on real runs, its ladder written under RetinaNet's name
    climb = store.load(tag="08_case_study/climb/screen")
    assert (climb.status == "ok").all() and "fused" in set(climb["config.optimizer_impl"])
    assert "retinanet: case-study fixes:" in text
    steps = [s["step"] for s in store.get_fact(machine_id(), "ladder/retinanet/quick")]
    assert steps == ["baseline", "case-study fixes"]
    for name in ("08_ladder", "08_frozen_layers", "08_climb"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000


def test_a_user_workload_through_the_notebooks(quick_run):
    """tests.user_workloads:tagger (dict inputs, an output object, batch norm, the fixes as
    options) through 01, 02, 03, 06 and 08: measured, profiled, tuned, and its fixes compared."""
    out, _ = quick_run
    store = ResultStore(out / "results.sqlite")
    for tag in ("01_baseline", "02_profiling", "03_threading", "06_bf16", "08_case_study"):
        df = store.load(tag=tag)
        mine = df[df["config.workload"] == USER]
        assert len(mine) and mine.status.isin(["ok", "unsupported"]).all(), tag  # bf16 may lack a kernel
    assert store.get_fact(machine_id(), f"profile/{USER}/quick")["coverage"] > 0
    mine = store.load(tag="08_case_study").query("`config.workload` == @USER")
    assert {json.loads(o or "{}").get("frozen_bn") for o in mine["config.options"]} == {None, "separate", "fused", "folded"}
    text = outputs_text(out / "notebooks" / "08_case_study_retinanet.ipynb")
    assert "FrozenBatchNorm2d folded into the conv over baseline" in text
    assert f"{USER}: not measured: multi-tensor and fused Lamb (it trains with sgd" in text
    assert f"{USER} case study:" in text
    steps = [s["step"] for s in store.get_fact(machine_id(), f"ladder/{USER}/quick")]
    assert steps[:2] == ["baseline", "threading"] and steps[-1] == "case-study fixes"  # bf16 where it has a fast path


def chromium(*args, timeout=120):
    import shutil
    import subprocess
    import tempfile

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (make test installs it as root: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                               "--disable-background-networking", "--disable-component-update", "--disable-sync",
                               f"--user-data-dir={profile}", "--virtual-time-budget=10000", *args],
                              capture_output=True, text=True, timeout=timeout)


def test_report_opens_in_a_browser_with_every_figure(quick_run):
    from cpuopt_helpers import system
    from cpuopt_helpers.report import build_report

    out, _ = quick_run
    index = build_report(out, system.collect_facts())
    figures = sorted((out / "figures").glob("*.png"))
    assert len(figures) >= 10 and len(list((index.parent / "notebooks").glob("*.html"))) >= len(EXECUTED)
    dom = chromium("--dump-dom", index.as_uri()).stdout
    assert f'data-figures-loaded="{len(figures)}/{len(figures)}"' in dom  # every <img> decoded by the browser
    assert "05_runtimes" in dom and "07_layouts" in dom and "cnn[quick]" in dom
    # it opens with the answer: every workload's ladder, with the command that trains with its last rung
    assert dom.index("The answer") < dom.index("Machine") < dom.index("Figures")
    for w in ("cnn", "transformer", "rnn", "retinanet"):
        assert f"cpuopt bench --workload {w} --preset quick" in dom
    shot = index.parent / "screenshot.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,2400", index.as_uri())
    assert shot.stat().st_size > 20_000


def test_the_docs_site_opens_with_every_figure_loaded(quick_run, tmp_path):
    """`make docs` on this run: the home page, this run's results page (every figure drawn by the
    browser) and one executed notebook of the report, built by MkDocs in strict mode."""
    import subprocess
    import sys

    from cpuopt_helpers import pages, site, system
    from cpuopt_helpers.report import build_report

    out, _ = quick_run
    facts = system.collect_facts()
    build_report(out, facts)
    page = pages.write_results_page(ResultStore(out / "results.sqlite"), facts, "quick", tmp_path / "results",
                                    out / "figures")
    config = site.source(Path(__file__).resolve().parents[1], out, results=tmp_path / "results")
    proc = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-f", str(config)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr
    for html, least in (("index.html", 0), (f"results/{page.stem}.html", 3)):
        dom = chromium("--dump-dom", (out / "site" / html).as_uri()).stdout
        loaded = re.search(r'data-figures-loaded="(\d+)/(\d+)"', dom)
        assert loaded and loaded.group(1) == loaded.group(2) and int(loaded.group(2)) >= least, (html, loaded)
    notebook = chromium("--dump-dom", (out / "site" / "report" / "notebooks" / "01_baseline.html").as_uri()).stdout
    assert "data:image/png;base64" in notebook and "01 · Baseline" in notebook


def test_summary_ladder_comes_from_the_store(quick_run):
    out, _ = quick_run
    text = outputs_text(out / "notebooks" / "09_summary.ipynb")
    assert re.search(r"peak fp32 .*measured GEMM \d+ GFLOP/s", text) and "\nclock " in text  # cpuopt doctor's words
    assert re.search(r"of the theoretical (fp32|bf16) peak|the theoretical (fp32|bf16) peak unknown here", text)
    for w in ("cnn", "transformer", "rnn"):
        assert f"- {w}: " in text and "per 1000 samples at $1/hour" in text
    assert (out / "figures" / "09_ladder.png").stat().st_size > 1000


def test_no_interval_or_verdict_from_fewer_rounds_than_the_minimum(quick_run):
    """Every printed interval names its rounds, and none comes from fewer than 5."""
    import re

    out, _ = quick_run
    seen = too_few = 0
    for path in sorted((out / "notebooks").glob("*.ipynb")):
        text = outputs_text(path)
        assert "bootstrap" not in text
        for rounds in re.findall(r"(?:CI|interval, per-look [0-9.]+%): [0-9.]+-[0-9.]+, (\d+) rounds", text):
            assert int(rounds) >= 5, path.name
            seen += 1
        for verdict_rounds in re.findall(r"\((\d+) rounds?, fewer than the 5 a verdict needs\): too few rounds", text):
            assert int(verdict_rounds) < 5
        too_few += text.count("too few rounds")
    assert seen and too_few  # both checks read something: 08's kernels give intervals, the 1-round confirmations none


def test_the_run_writes_a_dated_results_page_and_a_readme_block_that_checks(quick_run, tmp_path, monkeypatch):
    """What `make run` ends with (`cpuopt workbook readme --write README.md --page docs/results`),
    on this run's store: a page named after the day and the machine, its figures beside it, and
    a README block that `--check` regenerates byte for byte (and that fails once changed)."""
    import re

    from cpuopt_helpers import cli, pages, system

    out, _ = quick_run
    monkeypatch.setenv("CPUOPT_RESULTS", str(out / "results.sqlite"))
    monkeypatch.setenv("CPUOPT_BUILD", str(out))
    facts = system.collect_facts()
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n{pages.RESULTS_START}\nold\n{pages.RESULTS_END}\nafter\n")
    assert cli.main(["workbook", "readme", "--preset", "quick", "--write", str(readme),
                     "--page", str(tmp_path / "results")]) == 0
    assert cli.main(["workbook", "readme", "--preset", "quick", "--check", str(readme),
                     "--page", str(tmp_path / "results")]) == 0
    page = next(p for p in (tmp_path / "results").glob("*.md") if p.name != "index.md")  # the index lists it
    assert f"]({page.name})" in (tmp_path / "results" / "index.md").read_text()
    assert f"This run's whole record: [results/{page.name}](results/{page.name}), and every" in readme.read_text()
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d-.+-{pages.isa_slug(facts)}-quick\.md", page.name)
    text = page.read_text()
    assert facts.cpu_model in text and "cpuopt workbook readme --preset quick --page" in text
    assert "| of the measured fp32 GEMM ceiling | of the theoretical fp32 peak |" in text  # both shares of peak
    assert "each against fp32 as notebook 05 handed it on" in text  # notebook 06's reference, named
    assert "| workload | setting | against fp32 as handed on |" in text
    said = r"^The machine (was quiet|was mostly quiet|was busy with other work|had no other load, yet its CPUs moved)"
    assert re.search(said + r": .* runs", text, re.M)  # what the machine did
    assert re.search(r"^Wall time: the run that measured this page took .* for \d+ notebook\(s\)", text, re.M)
    assert "| 09_summary | ok | " in text  # each notebook's wall time
    assert re.search(r"^bf16, its speed and its accuracy on the digits model \(notebook 06; its figures above\), "
                     r"as the executed notebook concluded( \(the findings a table above gives are not repeated\))?:$",
                     text, re.M) and "test images" in text  # bf16's accuracy in words, not a figure alone
    from cpuopt_helpers.records import own_commit

    assert f", commit {own_commit()}." in text.splitlines()[2]  # the commit the run measured with (workbook run)
    images = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert images and all((page.parent / i).exists() for i in images)
    readme.write_text(readme.read_text().replace("| cnn |", "| cnn (edited) |"))
    assert cli.main(["workbook", "readme", "--preset", "quick", "--check", str(readme)]) == 1
