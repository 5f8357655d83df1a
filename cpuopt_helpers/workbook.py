"""Papermill orchestration of the notebooks: which run, with which parameters, into which folder."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from cpuopt_helpers import compare
from cpuopt_helpers.config import PRESETS
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.progress import HEADLESS
from cpuopt_helpers.results import build_dir
from cpuopt_helpers.session import parameter_list

log = logging.getLogger(__name__)
KERNEL = "cpuopt"
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


# What `make run` changes per preset so that the standard workbook aims at its 30 minutes: a
# standard CNN run costs ~10 s on two cores (~4 s of it starting Python, torch and
# torch._dynamo), so the standard preset measures the CNN only in 01-07 (the transformer and
# the RNN in the full preset, or `make run WORKLOADS=cnn,transformer,rnn`: on the 2-core Xeon
# with AMX their bf16 confirmations alone took 3.3 minutes, and the run 35 minutes with them)
# and RetinaNet at 80 classes in 08 (601 classes in `make case-study`), whose ladder is the paper's
# recipe adapted to the CPU (RECIPE: the fixes together, bf16 where gated), confirmed once against
# PyTorch's defaults by 09's headline (a stored climb of `make case-study` is kept instead);
# the baseline runs 2 rounds a workload; RetinaNet runs 3 timed steps, and 08's profile replays
# each primitive once after its warm-up (its profile cell took 268 s with 3 on the 2-core Ice Lake
# Xeon), and 08 screens no trainable_layers arm (its frozen-layers logs run them). 02 profiles
# channels-last and, where the CPU has a fast path, bf16; the IPEX runtime's profile and bf16's slow kernels
# (10-20x slower without a fast path; with IPEX's, 4-5 minutes of 02 on the 2-core AVX2 EPYC) are
# the full preset's. Screening runs every
# candidate once (SCREEN_ROUNDS = 1, the notebooks' default); each screening winner is
# confirmed in exactly compare.FIXED_ROUNDS = 8 fresh rounds (MIN_ROUNDS = MAX_ROUNDS: one look,
# the plain Student-t interval, power enough for a true 15% gain; ~21 s a CNN round here, ~50 s
# a RetinaNet one), BUDGET_MIN only a safety cap; 05 screens one optimizer arm (fused SGD; the
# full preset adds foreach SGD and the AdamW pair). The launcher comparison of 04 (PyTorch's defaults, run_cpu's defaults and the
# best setting, 5 interleaved rounds: 2-3 minutes) and torch.compile in 05 (a cold compile of
# the CNN took 122 s on the 2-core Xeon; 05 never hands it on, and `make case-study` measures it
# on RetinaNet with its break-even), zentorch's included (AMD's backend compiles too), run only
# in the full preset, which also screens in 2 rounds
# and confirms adaptively in 5 to 14 rounds. Parameters given to run_workbook win over these.
CONFIRM = {"MIN_ROUNDS": compare.FIXED_ROUNDS, "MAX_ROUNDS": compare.FIXED_ROUNDS, "BUDGET_MIN": 4.0}
SCREEN_TWICE = {"SCREEN_ROUNDS": 2, "BUDGET_MIN": 15.0}  # the full preset: and room for 5-14 rounds of its larger runs
CNN = {"WORKLOADS": ["cnn"]}
PRESET_PARAMETERS = {
    "standard": {"01": {"ROUNDS": 2, **CNN}, "02": {**CNN, "COMPARE_IPEX": [], "SLOW_BF16": False},
                 "03": {**CNN, **CONFIRM},
                 "04": {**CNN, "LAUNCHER_ROUNDS": 0, **CONFIRM},
                 "05": {**CNN, "OPTIMIZER_ARMS": ["SGD fused"], "COMPILE_MODES": [], "ZENTORCH": False, **CONFIRM},
                 "06": {**CNN, **CONFIRM}, "07": {**CONFIRM, "BUDGET_MIN": 6.0},  # a DDP round runs two ranks
                 "08": {"STEPS": 3, "KERNEL_ROUNDS": 5, "DISCREPANCY": False, "RECIPE": True, "PROFILE_REPEATS": 1,
                        "SCREEN_TRAINABLE": False, **CONFIRM, "BUDGET_MIN": 7.5},
                 "09": {"WORKLOADS": ["cnn", "retinanet"], "BUDGET_MIN": 6.0}},  # 5 RetinaNet rounds fit
    "full": {"03": SCREEN_TWICE, "04": {"LAUNCHER_ROUNDS": 5, **SCREEN_TWICE},
             "05": {"COMPILE_MODES": ["default", "max-autotune"], **SCREEN_TWICE},
             "06": SCREEN_TWICE, "07": SCREEN_TWICE, "08": SCREEN_TWICE, "09": {"BUDGET_MIN": 15.0}},
}


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
        if not names:
            raise CpuoptError(f"--workloads {workloads!r} names no workload; give e.g. --workloads cnn,retinanet")
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
    saved = {k: os.environ.get(k) for k in ("CPUOPT_BUILD", "CPUOPT_RESULTS", "PYTHONPATH", HEADLESS)}
    os.environ["CPUOPT_BUILD"] = str(out_dir)  # the kernels inherit it: figures and store land there
    os.environ[HEADLESS] = "1"  # no progress bars left in the executed notebooks (progress.bar)
    # the kernels run in notebooks/: a user's package.module:function beside the caller stays importable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), saved["PYTHONPATH"]) if p)
    if out:
        os.environ.pop("CPUOPT_RESULTS", None)  # results of this run belong beside its notebooks
    (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    try:
        keep_run_commit(preset)
        started = now_utc()
        report = _execute(books, out_dir, preset, parameters, progress, notebook_parameters or {})
        keep_run_times(preset, started, report)
        return report
    finally:
        for key, value in saved.items():  # leave the caller's environment as it was
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def keep_run_commit(preset: str) -> None:
    """Keep the commit this run measures with in its store, for the pages it writes
    (``pages.run_commit``): the README block and the results page name it."""
    from cpuopt_helpers.pages import RUN_FACT
    from cpuopt_helpers.records import own_commit
    from cpuopt_helpers.results import ResultStore
    from cpuopt_helpers.system import collect_facts

    ResultStore().put_fact(collect_facts().fingerprint, RUN_FACT.format(preset=preset), {"commit": own_commit()})


def now_utc() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def keep_run_times(preset: str, started: str, report: list[dict]) -> None:
    """Keep this run's wall time, notebook by notebook, in its store (the last RUNS_KEPT runs of the
    preset): the run's page gives the times of the run that measured its baseline
    (``pages.wall_time_lines``)."""
    from cpuopt_helpers.pages import RUNS_KEPT, TIMES_FACT
    from cpuopt_helpers.results import ResultStore
    from cpuopt_helpers.system import collect_facts

    store, machine, name = ResultStore(), collect_facts().fingerprint, TIMES_FACT.format(preset=preset)
    kept = store.get_fact(machine, name) or []
    run = {"started_at": started, "finished_at": now_utc(),
           "notebooks": [{k: r[k] for k in ("notebook", "status", "seconds")} for r in report]}
    store.put_fact(machine, name, (kept + [run])[-RUNS_KEPT:])


def declared_parameters(book: Path) -> list[str]:
    """The names a notebook's cell tagged ``parameters`` assigns, in order."""
    return list(declared_defaults(book))


NOT_LITERAL = object()  # a parameter whose default is an expression, not a literal


def declared_defaults(book: Path) -> dict:
    """{name: default} of the notebook's cell tagged ``parameters``, in order (``NOT_LITERAL`` where
    the default is an expression)."""
    import ast

    import nbformat

    def literal(node):
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError):
            return NOT_LITERAL

    for cell in nbformat.read(book, as_version=4).cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return {t.id: literal(node.value) for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
    return {}


def check_value(name: str, value, default) -> None:
    """Refuse a -p value of another kind than the notebook's default (a number where it takes a number,
    True or False where it takes a flag), or a negative one where the default is not, before any notebook runs."""
    wanted = ("True or False" if isinstance(default, bool) else "a whole number" if isinstance(default, int)
              else "a number" if isinstance(default, float) else None)
    fits = (isinstance(value, bool) if isinstance(default, bool) else
            isinstance(value, int) and not isinstance(value, bool) if isinstance(default, int) else
            isinstance(value, (int, float)) and not isinstance(value, bool) if isinstance(default, float) else True)
    if not fits:
        raise CpuoptError(f"-p {name} {value!r}: {name} takes {wanted} (its default: {default!r})")
    if isinstance(default, (int, float)) and not isinstance(default, bool) and default >= 0 and value < 0:
        raise CpuoptError(f"-p {name} {value!r}: {name} takes 0 or more (its default: {default!r})")


def check_parameters(books: list[Path], parameters: dict, notebook_parameters: dict[str, dict]) -> None:
    """Refuse, before anything runs, a parameter that none of the notebooks to run takes
    (a misspelt -p NAME would otherwise be dropped with a warning and the run go on without it)."""
    takes = {book.name[:2]: declared_defaults(book) for book in books}
    everyone = {name for names in takes.values() for name in names}
    for name in parameters:
        if name not in everyone:
            raise CpuoptError(f"no notebook among {', '.join(takes)} takes the parameter {name}; they take "
                              f"{', '.join(sorted(everyone))}")
    for number, chosen in notebook_parameters.items():
        for name in chosen:
            if number in takes and name not in takes[number]:
                raise CpuoptError(f"notebook {number} has no parameter {name}; it takes {', '.join(takes[number])}")
    for number, defaults in takes.items():
        for name, value in {**parameters, **notebook_parameters.get(number, {})}.items():
            if name in defaults and defaults[name] is not NOT_LITERAL and defaults[name] is not None:
                check_value(name, value, defaults[name])


def local_kernels(folder: str):
    """The kernel manager papermill starts each notebook's kernel with: its sockets are local files
    (ZeroMQ ipc), not TCP ports on localhost that any user of a shared server can reach, and the
    kernel does not warn, once a notebook, that its TCP traffic is unencrypted. The files lie in
    ``folder``, this run's own, under a name for each kernel: never in the notebooks' folder, where
    two runs' kernels would take each other's sockets, and never in one a run cannot write."""
    import uuid

    from jupyter_client import AsyncKernelManager
    from traitlets import default

    class LocalKernelManager(AsyncKernelManager):
        @default("transport")
        def _transport_default(self) -> str:
            return "ipc"

        @default("ip")
        def _ip_default(self) -> str:
            return os.path.join(folder, uuid.uuid4().hex[:12])

    return LocalKernelManager


def _execute(books: list[Path], out_dir: Path, preset: str, parameters: dict | None, progress: bool,
             notebook_parameters: dict[str, dict]) -> list[dict]:
    import tempfile

    from tqdm.auto import tqdm

    report = []
    with tempfile.TemporaryDirectory(prefix="cpuopt-kernels-") as sockets:
        kernels = local_kernels(sockets)  # one manager class; each kernel it starts takes its own socket name
        for book in tqdm(books, desc="workbook", unit="notebook", disable=not progress):
            report.append(_execute_one(book, out_dir, preset, parameters, progress, notebook_parameters, kernels))
    return report


def _execute_one(book: Path, out_dir: Path, preset: str, parameters: dict | None, progress: bool,
                 notebook_parameters: dict[str, dict], kernels) -> dict:
    """One notebook through papermill (``kernels``: its kernel manager): its line of the report."""
    import papermill

    target = out_dir / "notebooks" / book.name
    start = time.monotonic()
    line = {"notebook": book.name, "status": "ok", "output": str(target), "error": ""}
    try:
        chosen = {"PRESET": preset, **PRESET_PARAMETERS.get(preset, {}).get(book.name[:2], {}), **(parameters or {}),
                  **notebook_parameters.get(book.name[:2], {})}
        takes = declared_parameters(book)
        chosen = {k: v for k, v in chosen.items() if k in takes}  # each notebook gets the ones it has
        papermill.execute_notebook(str(book), str(target), parameters=chosen, kernel_name=KERNEL, language="python",
                                   cwd=str(book.parent), progress_bar=progress, kernel_manager_class=kernels)
    except papermill.PapermillExecutionError as exc:
        line.update(status="failed", error=f"cell {exc.exec_count}: {exc.ename}: {exc.evalue}")
    except Exception as exc:  # the kernel died or could not start: report and go on
        line.update(status="failed", error=f"{type(exc).__name__}: {exc}")
    return {**line, "seconds": time.monotonic() - start}


def format_report(report: list[dict]) -> str:
    lines = [f"{r['notebook']:<28} {r['status']:<7} {r['seconds']:6.1f} s  {r['output']}"
             + (f"\n    {r['error']}" if r["error"] else "") for r in report]
    failed = sum(r["status"] != "ok" for r in report)
    lines.append(f"{len(report) - failed} notebook(s) passed, {failed} failed")
    return "\n".join(lines)


