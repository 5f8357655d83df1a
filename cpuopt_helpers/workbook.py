"""Papermill orchestration of the notebooks, and the session object notebooks use."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from cpuopt_helpers import compare, launch, system
from cpuopt_helpers.config import PRESETS, RunConfig, setting_label
from cpuopt_helpers.decisions import Choice, Comparison, Finding
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.results import ResultStore, build_dir, run_comparison, run_sweep
from cpuopt_helpers.stages import LADDER_STAGES, stage_index

log = logging.getLogger(__name__)
KERNEL = "cpuopt"
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@dataclass
class Session:
    """What a notebook needs: the machine's facts, the results store and a runner.

    The notebook kernel never measures itself: every run goes through the launcher.
    """

    facts: dict = field(default_factory=system.collect_facts)
    store: ResultStore = field(default_factory=ResultStore)

    @property
    def machine(self) -> str:
        return self.facts["fingerprint"]

    def run(self, config: RunConfig) -> dict:
        return launch.run(config, self.facts)

    def __post_init__(self):
        if self.store.moved_aside:
            print(f"note: the results store held an older schema; it was moved aside to {self.store.moved_aside}")

    def sweep(self, configs, rounds: int = 1, tag: str | None = None, resume: bool = True) -> list[dict]:
        """Rounds of several configs (the order shuffled inside each), each result stored as it lands."""
        return run_sweep(configs, self.store, self.run, rounds=rounds, resume=resume, tag=tag,
                         machine=self.machine)

    def stored_run(self, config: RunConfig, tag: str) -> dict | None:
        """The latest ok run of exactly this configuration that a notebook stored under ``tag``
        on this machine, with this measuring code and caller environment; else None."""
        from cpuopt_helpers.config import validate
        from cpuopt_helpers.provenance import code_version, measuring_env

        code, env = code_version().get("measuring_hash"), measuring_env(os.environ)
        wanted = validate(config, self.facts["logical_cores"], self.facts["physical_cores"], check_workload=False)
        runs = [r for r in self.store.results(tag=tag, machine=self.machine)  # results hold the validated config
                if r["status"] == "ok" and r["config_hash"] == wanted.config_hash()
                and (r.get("code_version") or {}).get("measuring_hash") == code and r.get("caller_env") == env]
        return runs[-1] if runs else None

    def confirm(self, a: RunConfig, b: RunConfig, tag: str, min_rounds: int = compare.MIN_ROUNDS,
                max_rounds: int = compare.MAX_ROUNDS, budget_min: float | None = None, resume: bool = True) -> dict:
        """The adaptive A/B of b against a (``results.run_comparison``), in fresh rounds."""
        return run_comparison(a, b, self.store, self.run, tag=tag, machine=self.machine, min_rounds=min_rounds,
                              max_rounds=max_rounds, budget_s=budget_min * 60 if budget_min else None, resume=resume)

    def confirmer(self, tag: str, min_rounds: int = compare.MIN_ROUNDS, max_rounds: int = compare.MAX_ROUNDS,
                  budget_min: float | None = None, resume: bool = True):
        """``confirm`` with the notebook's parameters filled in, for ``choosing.choose``."""
        return lambda a, b: self.confirm(a, b, tag, min_rounds, max_rounds, budget_min, resume)

    def roofline(self, preset: str, remeasure: bool = False) -> dict:
        """The measured GEMM and copy ceilings, from the store or measured now."""
        from cpuopt_helpers import roofline

        name = f"roofline/{preset}"
        value = None if remeasure else self.store.get_fact(self.machine, name)
        if value is None:
            value = roofline.measure(preset)
            self.store.put_fact(self.machine, name, value)
        return value

    def hand_on(self, config: RunConfig, step: str, evidence: dict | None = None,
                comparison: Comparison | dict | None = None, ladder: str | None = None, stage: str | None = None) -> None:
        """Record the best configuration so far for a workload (the optimisation ladder),
        with the comparison that handed it on (ratio to the rung before, interval, verdict).

        ``step`` names the rung; ``stage`` the ladder stage it belongs to (default: the step
        itself; notebook 08's climb has several rungs a stage, e.g. "runtime: torch.compile" of
        stage "runtime"). Rungs are kept in the order of LADDER_STAGES, then of arrival: a
        notebook re-run alone replaces its own rung and leaves the others where they were.
        ``ladder`` names the ladder (default: the workload; notebook 08 keeps RetinaNet's
        601-class ladder apart).
        """
        stage = stage or step
        if stage not in LADDER_STAGES:
            raise CpuoptError(f"unknown ladder stage {stage!r}; use one of {', '.join(LADDER_STAGES)}")
        name = f"ladder/{ladder or config.workload}/{config.preset}"
        kept = comparison.to_dict() if isinstance(comparison, Comparison) else \
            Comparison.from_dict(comparison).to_dict() if comparison else None
        rungs = [s for s in self.store.get_fact(self.machine, name, []) if s["step"] != step] + [
            {"step": step, "stage": stage, "config": config.to_dict(), "evidence": dict(evidence or {}, comparison=kept)}]
        rungs.sort(key=lambda s: stage_index(s.get("stage", s["step"])))
        self.store.put_fact(self.machine, name, rungs)

    def settle(self, stage: str, decide, min_rounds: int = compare.MIN_ROUNDS, max_rounds: int = compare.MAX_ROUNDS,
               budget_min: float | None = None, resume: bool = True) -> Choice:
        """How a measuring notebook ends, for one workload: ``decide(confirm) -> Choice`` (the
        stage's ``choose`` with the notebook's confirmation rounds), its finding stored, and the
        configuration it chose handed on as the stage's rung."""
        from cpuopt_helpers.stages import stage as find_stage

        s = find_stage(stage)
        choice = decide(self.confirmer(f"{s.tag}/confirm", min_rounds, max_rounds, budget_min, resume))
        self.record(choice.finding, choice.config.preset if choice.config is not None else "")
        if choice.config is not None:
            self.hand_on(choice.config, s.rung, {"workload": choice.finding.workload, "sentence": choice.sentence,
                                                 "finding": choice.finding.to_dict()}, choice.comparison)
        return choice

    def record(self, finding: Finding, preset: str) -> None:
        """Store a stage's finding for its workload (the latest replaces the one before)."""
        self.store.put_fact(self.machine, f"findings/{finding.stage}/{finding.workload}/{preset}", finding.to_dict())

    def findings(self, prefix: str = "") -> list[Finding]:
        """The stored findings whose stage starts with ``prefix``, as records."""
        names = self.store.fact_names(self.machine, f"findings/{prefix}")
        return [Finding.from_dict(self.store.get_fact(self.machine, n)) for n in names]

    def reset_ladder(self, ladder: str, preset: str) -> None:
        """Forget a ladder's rungs (a climb that starts again from PyTorch's defaults)."""
        self.store.put_fact(self.machine, f"ladder/{ladder}/{preset}", [])

    def best_config(self, workload: str, preset: str, before: str | None = None) -> RunConfig:
        """The last configuration handed on for this workload, else the preset's default.

        ``before`` names the stage asking: it starts from the rungs ahead of its own, so a
        notebook re-run after a full run measures from the same base as in that run.
        """
        ladder = self.store.get_fact(self.machine, f"ladder/{workload}/{preset}", [])
        if before is not None:
            ladder = [s for s in ladder if stage_index(s.get("stage", s["step"])) < stage_index(before)]
        return RunConfig.from_dict(ladder[-1]["config"]) if ladder else RunConfig.for_preset(workload, preset)


# What `make run` changes per preset so the standard workbook stays within its 30 minutes: a
# standard CNN run costs ~10 s on two cores (~4 s of it starting Python, torch and
# torch._dynamo), so the standard preset measures the CNN only in 01-07 (the transformer and
# the RNN in the full preset, or `make run WORKLOADS=cnn,transformer,rnn`: on the 2-core Xeon
# with AMX their bf16 confirmations alone took 3.3 minutes, and the run 35 minutes with them)
# and RetinaNet at 80 classes in 08 (601 classes in `make case-study`);
# the baseline runs 2 rounds a workload; RetinaNet runs 3 timed steps. Screening runs every
# candidate once (SCREEN_ROUNDS = 1, the notebooks' default); each screening winner is
# confirmed in exactly MIN_ROUNDS = 5 fresh rounds (MAX_ROUNDS = 5: one look, the plain
# Student-t interval; ~21 s a CNN round here, ~50 s a RetinaNet one), BUDGET_MIN only a
# safety cap; 05 screens one optimizer arm (fused SGD; the full preset adds foreach SGD and the
# AdamW pair). The launcher comparison of 04 (PyTorch's defaults, run_cpu's defaults and the
# best setting, 5 interleaved rounds: 2-3 minutes) and torch.compile in 05 (a cold compile of
# the CNN took 122 s on the 2-core Xeon; 05 never hands it on, and `make case-study` measures it
# on RetinaNet with its break-even) run only in the full preset, which also screens in 2 rounds
# and confirms adaptively in 5 to 14 rounds. Parameters given to run_workbook win over these.
CONFIRM = {"MAX_ROUNDS": 5, "BUDGET_MIN": 3.0}
SCREEN_TWICE = {"SCREEN_ROUNDS": 2}
CNN = {"WORKLOADS": ["cnn"]}
PRESET_PARAMETERS = {
    "standard": {"01": {"ROUNDS": 2, **CNN}, "02": CNN,
                 "03": {**CNN, **CONFIRM},
                 "04": {**CNN, "LAUNCHER_ROUNDS": 0, **CONFIRM},
                 "05": {**CNN, "OPTIMIZER_ARMS": ["SGD fused"], "COMPILE_MODES": [], **CONFIRM},
                 "06": {**CNN, **CONFIRM}, "07": CONFIRM,
                 "08": {"STEPS": 3, "KERNEL_ROUNDS": 5, "DISCREPANCY": False, **CONFIRM, "BUDGET_MIN": 4.5},
                 "09": {"WORKLOADS": ["cnn", "retinanet"], **CONFIRM}},
    "full": {"03": SCREEN_TWICE, "04": {"LAUNCHER_ROUNDS": 5, **SCREEN_TWICE},
             "05": {"COMPILE_MODES": ["default", "max-autotune"], **SCREEN_TWICE},
             "06": SCREEN_TWICE, "07": SCREEN_TWICE, "08": SCREEN_TWICE},
}


def parameter_list(value, item: type = str) -> list:
    """A notebook's list parameter as a list, however it came: a list, or the string papermill's
    ``-p`` hands over (a JSON list, '["a", "b"]', or comma-separated, 'a,b').

    >>> parameter_list('["cnn", "mypkg.model:build"]'), parameter_list("16, 64", int)
    (['cnn', 'mypkg.model:build'], [16, 64])
    """
    import json

    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise CpuoptError(f"cannot read {value!r} as a JSON list ({exc}); write it as "
                                  "'[\"a\", \"b\"]' or as a,b") from None
        else:
            value = [v.strip() for v in text.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        value = [value]
    try:
        return [item(v) for v in value]
    except (TypeError, ValueError):
        raise CpuoptError(f"{value!r}: every item must be of type {item.__name__}") from None


def cli_parameters(workloads: str | None, pairs: list[list[str]]) -> dict:
    """The notebook parameters of ``cpuopt workbook run --workloads A,B -p NAME VALUE``: values
    read as papermill's -p reads them (numbers, True/False/None, else the string)."""
    import ast

    def value(text: str):
        if text in ("True", "False", "None"):
            return ast.literal_eval(text)
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return text

    chosen = {}
    if workloads:
        names = parameter_list(workloads)
        from cpuopt_helpers.config import check_workload_spec

        for name in names:
            check_workload_spec(name)  # an unknown or unimportable workload stops here, before any notebook
        chosen["WORKLOADS"] = names
    for name, text in pairs:
        if not name.isidentifier() or not name.isupper():
            raise CpuoptError(f"-p {name}: notebook parameters are UPPER_CASE names, e.g. -p ROUNDS 3")
        chosen[name] = value(text)
    return chosen


def list_notebooks(only: list[str] | None = None, folder: Path | None = None) -> list[Path]:
    """The workbook's notebooks in order (NN_name.ipynb), optionally only some numbers."""
    books = sorted(p for p in (folder or NOTEBOOKS).glob("[0-9][0-9]_*.ipynb"))
    if only:
        wanted = {o.zfill(2) for o in only}
        unknown = wanted - {p.name[:2] for p in books}
        if unknown:
            raise CpuoptError(f"no notebook numbered {', '.join(sorted(unknown))}; "
                              f"have {', '.join(p.name[:2] for p in books)}")
        books = [p for p in books if p.name[:2] in wanted]
    return books


def check_kernel(name: str = KERNEL) -> None:
    from jupyter_client.kernelspec import KernelSpecManager

    if name not in KernelSpecManager().find_kernel_specs():
        raise CpuoptError(f"Jupyter kernel {name!r} is not registered; run `make setup` "
                          f"(or: python -m ipykernel install --sys-prefix --name {name})")


def run_workbook(preset: str = "standard", only: list[str] | None = None, out: str | None = None,
                 parameters: dict | None = None, progress: bool = True, folder: Path | None = None,
                 notebook_parameters: dict[str, dict] | None = None) -> list[dict]:
    """Execute the notebooks in order with papermill; a failing one does not stop the rest.

    ``parameters`` go to every notebook; ``notebook_parameters`` (keyed by number, "03")
    to one; both win over the preset's own choices (PRESET_PARAMETERS).

    Executed notebooks go to OUT/notebooks, figures to OUT/figures, results to
    OUT/results.sqlite (OUT defaults to build/). Returns one report row per notebook.
    """
    if preset not in PRESETS:
        raise CpuoptError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
    books = list_notebooks(only, folder)
    check_parameters(books, parameters or {}, notebook_parameters or {})
    check_kernel()
    out_dir = Path(out).resolve() if out else build_dir().resolve()
    saved = {k: os.environ.get(k) for k in ("CPUOPT_BUILD", "CPUOPT_RESULTS", "PYTHONPATH")}
    os.environ["CPUOPT_BUILD"] = str(out_dir)  # the kernels inherit it: figures and store land there
    # the kernels run in notebooks/: a user's package.module:function beside the caller stays importable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), saved["PYTHONPATH"]) if p)
    if out:
        os.environ.pop("CPUOPT_RESULTS", None)  # results of this run belong beside its notebooks
    (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    try:
        return _execute(books, out_dir, preset, parameters, progress, notebook_parameters or {})
    finally:
        for key, value in saved.items():  # leave the caller's environment as it was
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def declared_parameters(book: Path) -> list[str]:
    """The names a notebook's cell tagged ``parameters`` assigns, in order."""
    import ast

    import nbformat

    for cell in nbformat.read(book, as_version=4).cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return [t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)]
    return []


def check_parameters(books: list[Path], parameters: dict, notebook_parameters: dict[str, dict]) -> None:
    """Refuse, before anything runs, a parameter that none of the notebooks to run takes
    (a misspelt -p NAME would otherwise be dropped with a warning and the run go on without it)."""
    takes = {book.name[:2]: declared_parameters(book) for book in books}
    everyone = {name for names in takes.values() for name in names}
    for name in parameters:
        if name not in everyone:
            raise CpuoptError(f"no notebook among {', '.join(takes)} takes the parameter {name}; they take "
                              f"{', '.join(sorted(everyone))}")
    for number, chosen in notebook_parameters.items():
        for name in chosen:
            if number in takes and name not in takes[number]:
                raise CpuoptError(f"notebook {number} has no parameter {name}; it takes {', '.join(takes[number])}")


def _execute(books: list[Path], out_dir: Path, preset: str, parameters: dict | None, progress: bool,
             notebook_parameters: dict[str, dict]) -> list[dict]:
    import papermill
    from tqdm.auto import tqdm

    report = []
    for book in tqdm(books, desc="workbook", unit="notebook", disable=not progress):
        target = out_dir / "notebooks" / book.name
        start = time.monotonic()
        try:
            chosen = {"PRESET": preset, **PRESET_PARAMETERS.get(preset, {}).get(book.name[:2], {}), **(parameters or {}),
                      **notebook_parameters.get(book.name[:2], {})}
            takes = declared_parameters(book)
            chosen = {k: v for k, v in chosen.items() if k in takes}  # each notebook gets the ones it has
            papermill.execute_notebook(str(book), str(target), parameters=chosen,
                                       kernel_name=KERNEL, language="python", cwd=str(book.parent),
                                       progress_bar=progress)
            report.append({"notebook": book.name, "status": "ok", "seconds": time.monotonic() - start,
                           "output": str(target), "error": ""})
        except papermill.PapermillExecutionError as exc:
            report.append({"notebook": book.name, "status": "failed", "seconds": time.monotonic() - start,
                           "output": str(target),
                           "error": f"cell {exc.exec_count}: {exc.ename}: {exc.evalue}"})
        except Exception as exc:  # the kernel died or could not start: report and go on
            report.append({"notebook": book.name, "status": "failed", "seconds": time.monotonic() - start,
                           "output": str(target), "error": f"{type(exc).__name__}: {exc}"})
    return report


def format_report(report: list[dict]) -> str:
    lines = [f"{r['notebook']:<28} {r['status']:<7} {r['seconds']:6.1f} s  {r['output']}"
             + (f"\n    {r['error']}" if r["error"] else "") for r in report]
    failed = sum(r["status"] != "ok" for r in report)
    lines.append(f"{len(report) - failed} notebook(s) passed, {failed} failed")
    return "\n".join(lines)


RESULTS_START, RESULTS_END = "<!-- results:start -->", "<!-- results:end -->"


def results_markdown(store: ResultStore, facts: dict, preset: str = "standard") -> str:
    """The README's results section, generated from the store of a workbook run."""
    from datetime import date

    from cpuopt_helpers.stages import baseline, choosing

    machine = facts["fingerprint"]
    runs = last_sweep_runs(store, "01_baseline", machine, preset)
    roof = store.get_fact(machine, f"roofline/{preset}")
    if not runs or roof is None:
        raise CpuoptError(f"no {preset} results for this machine in {store.path}; run `make run` first")
    table = choosing.throughput_table(runs)
    day = max(r["created_at"] for r in runs)[:10] if runs else date.today().isoformat()
    lines = [
        f"Measured on {day} by `make run` (preset `{preset}`) on **{facts['cpu_model']}**, "
        f"{facts['physical_cores']} physical / {facts['logical_cores']} logical cores, {facts['memory_gib']} GiB, "
        f"torch {facts['versions']['torch']}, oneDNN {facts['versions']['onednn']}.",
        "",
        "| workload | samples/s (median; range over runs) | step ms | forward | backward | optimizer | GFLOP/s | share of GEMM peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    peak = roof["gemm_gflops_best"]
    for name, row in table.iterrows():
        lines.append(f"| {name} | {row['samples_per_s']:.1f} ({row['low']:.1f}-{row['high']:.1f}, {row['runs']} runs) | "
                     f"{row['step_ms']:.0f} | {row['forward_share']:.0%} | {row['backward_share']:.0%} | "
                     f"{row['optimizer_share']:.0%} | {row['gflops']:.1f} | {row['gflops'] / peak:.0%} |")
    lines += ["", *[f"- {line}" for line in baseline.system_findings(facts, roof)[:2]],
              *[f"- {line}" for line in baseline.findings(table, peak)],
              "", "![baseline](docs/01_baseline.png)"]
    launchers = bool(last_sweep_runs(store, "04_launchers", machine, preset))
    lines += _profile_lines(store, machine, table.index, preset) + _launcher_lines(store, machine, preset)
    from cpuopt_helpers import ladder

    ladders = list(table.index) + [n for n in ladder.workloads(store, machine, preset, "retinanet") if n not in table.index]
    lines += _precision_lines(store, machine, preset) + _ladder_lines(store, facts, ladders, preset)
    lines += _paper_lines(store, machine, preset)
    lines += ["", "![thread scaling](docs/03_scaling.png)", *(["![launchers](docs/04_launchers.png)"] if launchers else []),
              "![bf16 throughput](docs/06_throughput.png)", "![bf16 accuracy](docs/06_accuracy.png)"]
    lines += _confirmation_lines(store, machine)
    lines += _answer_lines(Path(store.path).parent / "notebooks")
    return "\n".join(lines)


def last_sweep_runs(store: ResultStore, tag: str, machine: str, preset: str | None = None) -> list[dict]:
    """The results of the latest sweep with this tag (of this preset): a re-run notebook's
    sweep replaces the earlier one in the README, never mixes with it."""
    sweeps = [s for s in store.sweeps(kind="sweep", machine=machine) if s["tag"] == tag
              and (preset is None or any(arm["preset"] == preset for arm in s["arms"]))]
    return store.results(sweep=sweeps[-1]["id"]) if sweeps else []


def _confirmation_lines(store: ResultStore, machine: str) -> list[str]:
    """Every adaptive A/B of the run: what was confirmed against what, in how many rounds,
    and why it stopped (the verdict, or the budget) - what the time budget allowed."""

    rows = []
    for sweep in store.sweeps(kind="ab", machine=machine):
        runs = [r for r in store.results(sweep=sweep["id"]) if r["status"] == "ok"]
        by = {(r["arm"], r["round"]): r["samples_per_s"] for r in runs}
        rounds = sorted({k[1] for k in by if (0, k[1]) in by and (1, k[1]) in by})
        if not rounds:
            continue
        design = store.get_fact(machine, f"ab/{sweep['id']}") or {}  # as it ran (older stores: the defaults)
        result = compare.sequential_ratio([by[(0, i)] for i in rounds], [by[(1, i)] for i in rounds],
                                          design.get("min_rounds", compare.MIN_ROUNDS),
                                          design.get("max_rounds", compare.MAX_ROUNDS))
        change = setting_label(sweep["arms"][1], sweep["arms"][0])
        rows.append(f"| {(sweep['tag'] or '').split('/')[0]} | {sweep['arms'][0]['workload']} | {change} | "
                    f"{compare.describe(result)} |")
    if not rows:
        return []
    return ["", "Every confirmation of this run (a screening winner against the incumbent in fresh rounds, as many "
            "as the notebook's MIN_ROUNDS, MAX_ROUNDS and BUDGET_MIN allowed): the rounds and the verdict, with the "
            "interval of the comparison's own design.", "",
            "| notebook | workload | change confirmed | ratio, interval, rounds: verdict |", "|---|---|---|---|", *rows]


ANSWERS = {"05_ipex": ("IPEX and its upstream replacements (notebook 05)", ["05_runtimes"]),
           "07_multi_instance": ("Multi-instance and DDP (notebook 07)", ["07_layouts", "07_convergence"]),
           "08_case_study_retinanet": ("The RetinaNet case study (notebook 08)", ["08_ladder", "08_frozen_layers"]),
           "09_summary": ("The ladder (notebook 09)", ["09_ladder"])}


def notebook_answer(path: Path) -> list[str]:
    """The findings a notebook printed in its last code cell (its answer), one per line."""
    import nbformat

    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    text = "".join(o.get("text", "") for o in (cells[-1].get("outputs", []) if cells else [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")  # not progress bars
    return [line for line in text.replace("\r", "\n").splitlines() if line.startswith("- ")]  # after progress bars


def _answer_lines(folder: Path) -> list[str]:
    """Each later notebook's answer, quoted from the executed notebook, with its figures."""
    lines = []
    for stem, (title, figures) in ANSWERS.items():
        path = folder / f"{stem}.ipynb"
        if not path.exists():
            continue
        lines += ["", f"{title}, as the executed notebook concluded:", "", *notebook_answer(path), ""]
        lines += [f"![{f}](docs/{f}.png)" for f in figures]
    return lines


def _precision_lines(store: ResultStore, machine: str, preset: str) -> list[str]:
    from cpuopt_helpers.stages import choosing

    runs = last_sweep_runs(store, "06_bf16", machine)
    if not runs:
        return []
    lines = ["", "bf16 autocast against fp32 (notebook 06, loss in fp32; on a CPU without a bf16 fast path "
             "it runs on the quick preset; screening rounds):", "", "| workload | setting | vs fp32 |", "|---|---|---|"]
    for w in dict.fromkeys(r["config"]["workload"] for r in runs):
        first = min((r for r in runs if r["config"]["workload"] == w), key=lambda r: r["arm"])["config"]
        for _, row in choosing.compare_configs(runs, first, w).iterrows():
            if isinstance(row.get("comparison"), dict):
                lines.append(f"| {w} | {row['setting']} | {compare.describe(row['comparison'])} |")
        for r in runs:
            if r["config"]["workload"] == w and r["status"] == "unsupported" and r["round"] == 0:
                reason = r["reason"].splitlines()[-1].replace("cpuopt worker: ", "")[:140]
                lines.append(f"| {w} | {setting_label(r['config'], first)} | {reason} |")
    return lines


def _ladder_lines(store: ResultStore, facts: dict, workloads, preset: str) -> list[str]:
    from cpuopt_helpers import compare, ladder

    lines = ["", "The optimisation ladder: what each notebook handed on (a step that kept the previous "
             "configuration says so), and the last rung over PyTorch's defaults (`cpuopt ladder` prints it).", "",
             "| workload | ladder | over PyTorch's defaults |", "|---|---|---|"]
    for w in workloads:
        rungs = ladder.rungs(store, facts["fingerprint"], w, preset, facts["physical_cores"])
        if not rungs:
            continue
        steps = " -> ".join(f"{r.step}: {r.change}" for r in rungs[1:])
        chained, end = rungs[-1].vs_baseline, ladder.top_end_to_end(rungs)
        over = (f"{end.describe()} (the top against the defaults in fresh paired rounds)" if end else
                compare.describe(chained) if any(not r.kept for r in rungs[1:])
                else "1.00x: every stage kept PyTorch's defaults")
        lines.append(f"| {w} | baseline -> {steps} | {over} |" if steps else f"| {w} | baseline (nothing handed on) | |")
    return lines if len(lines) > 5 else []


def _paper_lines(store: ResultStore, machine: str, preset: str) -> list[str]:
    """Notebook 08's table: the paper's RetinaNet numbers beside this machine's."""
    rows = store.get_fact(machine, f"case-study/paper/{preset}")
    if not rows:
        return []
    lines = ["", "The paper's RetinaNet numbers beside this machine's (notebook 08; ratios, an interval where the run "
             "had the rounds for one):", "", "| fix | the paper | here | why (this run's data) |", "|---|---|---|---|"]
    for r in rows:
        paper = f"{r['paper']:.2f}x" if r["paper"] and r["paper"] == r["paper"] else "-"  # None, or NaN from a table
        lines.append(f"| {r['fix']} | {paper} | {r['here, worded']} | {r['why']} |")
    return lines


def _profile_lines(store: ResultStore, machine: str, workloads, preset: str) -> list[str]:
    rows = [(w, store.get_fact(machine, f"profile/{w}/{preset}")) for w in workloads]
    rows = [(w, p) for w, p in rows if p]
    if not rows:
        return []
    lines = ["", "ProfileDNN (notebook 02): share of the measured step in oneDNN primitives, and the efficiency "
             "ratio (replayed kernel-only time / measured step).", "",
             "| workload | step ms | oneDNN coverage | efficiency ratio | operator spans per step |", "|---|---|---|---|---|"]
    for w, p in rows:
        eff = f"{p['efficiency']:.0%}" if p.get("efficiency") is not None else "n/a"
        spans = f"{p['ops_per_step']:.0f}" if p.get("ops_per_step") is not None else "n/a"
        lines.append(f"| {w} | {p['step_ms']:.1f} | {p['coverage']:.0%} | {eff} | {spans} |")
    return lines


def _launcher_lines(store: ResultStore, machine: str, preset: str) -> list[str]:
    from cpuopt_helpers.stages import choosing

    runs = last_sweep_runs(store, "04_launchers", machine, preset)
    if not runs:
        return ["", "Launchers (notebook 04): the best setting against PyTorch's and `run_cpu`'s defaults was not "
                f"measured in the {preset} preset (`make run PRESET=full` measures it)."]
    lines = ["", "Threading, allocator and launchers (notebooks 03-04): the best setting handed on, as a ratio to "
             "PyTorch's defaults measured in interleaved rounds, next to `run_cpu`'s defaults.", "",
             "| workload | setting | vs PyTorch's defaults |", "|---|---|---|"]
    notes = []
    for w in dict.fromkeys(r["config"]["workload"] for r in runs):
        default = min((r for r in runs if r["config"]["workload"] == w), key=lambda r: r["arm"])["config"]
        table = choosing.compare_configs(runs, default, w)
        for _, row in table.iterrows():
            comparison = row.get("comparison") if isinstance(row.get("comparison"), dict) else None
            name = ("PyTorch's defaults" if row["is_baseline"] else
                    "run_cpu's defaults" if row["config"]["launcher"] == "run_cpu" else f"best: {row['setting']}")
            lines.append(f"| {w} | {name} | {compare.describe(comparison) if comparison else '1.00x'} |")
            if name.startswith("best") and comparison and comparison["verdict"] in ("slower", "no different",
                                                                                   "equivalent"):
                notes.append(f"- {w}: the setting handed on measured {comparison['ratio']:.2f}x PyTorch's defaults "
                             f"in this later sweep ({comparison['verdict']}): its confirmed win in notebooks 03-04 "
                             "did not replicate here.")
    return lines + ([""] + notes if notes else [])


def update_readme(readme: Path, section: str) -> None:
    """Replace the text between the results markers of the README."""
    text = readme.read_text()
    start, end = text.index(RESULTS_START) + len(RESULTS_START), text.index(RESULTS_END)
    readme.write_text(text[:start] + "\n" + section + "\n" + text[end:])
