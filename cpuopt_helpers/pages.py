"""The results pages, worded from the results store of this machine: the README's generated
block (``results_markdown``: the answer per workload, short enough for the first screen) and the
whole record of a run (``results_page``: the ladder, the confirmations of this run, the executed
notebooks' answers, with their figures)."""

from __future__ import annotations

import re
from pathlib import Path

from cpuopt_helpers import compare
from cpuopt_helpers.config import RunConfig, setting_hash, setting_label
from cpuopt_helpers.decisions import RECIPE
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.results import ResultStore, loaded_sentence
from cpuopt_helpers.system import Facts

RESULTS_START, RESULTS_END = "<!-- results:start -->", "<!-- results:end -->"


def results_markdown(store: ResultStore, facts: Facts, preset: str = "standard", page: str | None = None) -> str:
    """The README's generated block: per workload the configuration its ladder confirmed, its
    speedup over PyTorch's defaults with the interval (the top against the defaults in fresh
    paired rounds where the run measured it; else the product of the rungs, labelled so) and the
    `cpuopt bench` line that measures it again, stamped with the machine, the day and the code that
    measured; ``page``: the link to the run's dated page (``page_stem``), where one is written."""
    from cpuopt_helpers import ladder

    machine = facts.fingerprint
    names = ladder.workloads(store, machine, preset)
    runs = [r for r in store.results(machine=machine) if r["config"].get("preset") == preset]
    if not names or not runs:
        raise CpuoptError(f"no {preset} ladder for this machine in {store.path}; run `make run` first")
    days = measured_days(store, machine, preset)
    lines = [_stamp(facts, runs, preset, run_commit(store, machine, preset), days), "",
             *answer_table(store, facts, preset), *check_lines(store, facts, preset)]
    record = f"[{page}]({page}), and " if page else ""
    lines += ["", f"Each rung with its own interval: `cpuopt ladder`. This run's whole record: {record}every table, "
              "figure and executed notebook in `build/report/index.html` (on the machine that ran it). This block is "
              "written by `cpuopt workbook readme --write README.md`."]
    return "\n".join(lines)


def answer_table(store: ResultStore, facts: Facts, preset: str) -> list[str]:
    """Per workload with a ladder: the configuration it confirmed, its headline over PyTorch's defaults
    and the line that measures it again (the README's table; the run's page opens with it)."""
    from cpuopt_helpers import ladder

    rows = [_answer_row(name, rungs) for name in ladder.workloads(store, facts.fingerprint, preset)
            if (rungs := ladder.rungs(store, facts.fingerprint, name, preset, facts.physical_cores or 1))]
    head = "| workload | confirmed configuration | over PyTorch's defaults | measure it yourself |"
    return [head, "|---|---|---|---|", *rows] if rows else []


RUN_FACT = "workbook/run/{preset}"  # what `cpuopt workbook run` keeps of itself: the commit it ran
TIMES_FACT = "workbook/times/{preset}"  # ... and each run's wall time, notebook by notebook
RUNS_KEPT = 20


def run_commit(store: ResultStore, machine: str, preset: str) -> str | None:
    """The commit of the last ``cpuopt workbook run`` of this preset into the store (None: not kept)."""
    return (store.get_fact(machine, RUN_FACT.format(preset=preset)) or {}).get("commit")


def measured_days(store: ResultStore, machine: str, preset: str) -> str:
    """The day(s) the last run of this preset measured on: from its baseline sweep's first run to the
    store's last run of the preset ('2026-12-06 to 2026-12-07' for a run across midnight, UTC), so
    that the README's block and the run's page give the same dates."""
    baseline = last_sweep_runs(store, "01_baseline", machine, preset)
    runs = [r for r in store.results(machine=machine) if r["config"].get("preset") == preset]
    first = min((r["created_at"] for r in baseline), default=None) or min((r["created_at"] for r in runs), default="")
    last = max((r["created_at"] for r in runs if r["created_at"] >= first), default=first)
    return first[:10] if last[:10] == first[:10] else f"{first[:10]} to {last[:10]}"


def _stamp(facts: Facts, runs: list[dict], preset: str, commit: str | None, days: str) -> str:
    """Where, when and with what code the block's figures were measured."""
    isa = facts.isa
    level = ", ".join(name for flag, name in (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX"))
                      if isa.get(flag)) or ("AVX2" if isa.get("avx2") else "no AVX2")
    code = runs[-1].get("code_version") or {}
    made = f", cpuopt {code['package']} (measuring code {code['measuring_hash']})" if code.get("measuring_hash") else ""
    made += f", commit {commit}" if commit else ""
    return (f"Measured on {days} (preset `{preset}`) on **{facts.cpu_model}** "
            f"({core_words(facts, '; ')}{level}), {cores_words(facts)}, "
            f"torch {facts.versions.get('torch', '?')}{made}.")


def core_words(facts: Facts, then: str = "") -> str:
    """'AMD Zen 4 in a virtual machine' (what the CPU's row in cpuopt's peak table names, and whether a
    hypervisor runs it), followed by ``then``; '' where neither is known."""
    said = " ".join(filter(None, [facts.microarchitecture, "in a virtual machine" if facts.virtual_machine else ""]))
    return f"{said}{then}" if said else ""


def cores_words(facts: Facts) -> str:
    """'2 physical / 2 logical cores', and in a VM that they are the vCPUs its host gives it (a physical
    core's figures there are a vCPU's)."""
    return (f"{facts.physical_cores} physical / {facts.logical_cores} logical cores"
            + (" (a VM's vCPUs)" if facts.virtual_machine else ""))


def _answer_row(workload: str, rungs) -> str:
    """One workload's answer as a row of the README's table."""
    setting, over, command = answer(rungs)
    escaped = command.replace("|", "\\|")  # a pipe inside a table cell
    return f"| {workload} | {setting} | {over} | `{escaped}` |"


def answer(rungs) -> tuple[str, str, str]:
    """A ladder's answer, as the README and the run's report give it: the configuration to train
    with, its headline over PyTorch's defaults (the top against them in fresh paired rounds where
    measured), and the `cpuopt bench` line that measures it again."""
    from cpuopt_helpers import ladder
    from cpuopt_helpers.planning import command_lines

    top, end = rungs[-1], ladder.top_end_to_end(rungs)
    changed = any(not r.kept for r in rungs[1:])
    setting, trains = trained_with(rungs)
    over = (f"{end.describe()}, the top against the defaults in fresh paired rounds" if end else
            "not compared with the defaults yet (notebook 09 compares it)" if changed and top.step == RECIPE else
            f"{compare.describe(top.vs_baseline)}, from the rungs' own confirmations" if changed
            else "nothing confirmed faster than the defaults")
    if changed and top.step == RECIPE:  # one block: which of its parts pay is not this comparison's to say
        over += "; the recipe is one block here (`make case-study` confirms its parts one at a time)"
    optimizer = rungs[0].config.get("optimizer", RunConfig.optimizer)
    if optimizer != RunConfig.optimizer:  # the workload's own training choice (the paper's Lamb), not a setting
        over += f"; the defaults here train with optimizer={optimizer}, as the top does"
    return setting, over, command_lines(RunConfig.from_dict(trains))["bench"]


def trained_with(rungs) -> tuple[str, dict]:
    """What a ladder's answer trains with: the configuration in words and as a dict (the top; make
    run's RetinaNet recipe only where confirmed faster than the defaults, else the defaults)."""
    from cpuopt_helpers import ladder

    top, end = rungs[-1], ladder.top_end_to_end(rungs)
    changed = any(not r.kept for r in rungs[1:])
    setting = (setting_label(top.config, rungs[0].config) if changed else "") or "PyTorch's defaults"
    if changed and top.step == RECIPE:  # make run's RetinaNet: named as what it is; its headline its one confirmation
        setting = f"{RECIPE}: {setting}"
        if not (end and end.pays):  # not confirmed faster: the defaults stay what to train with
            return f"PyTorch's defaults ({setting}: not confirmed faster)", rungs[0].config
    return setting, top.config


def check_lines(store: ResultStore, facts: Facts, preset: str) -> list[str]:
    """Per ladder whose answer is not the defaults: the `cpuopt compare` line that checks it against
    PyTorch's defaults in paired rounds (the README's block gives them under its table)."""
    from cpuopt_helpers import ladder
    from cpuopt_helpers.config import compare_line

    found = []
    for name in ladder.workloads(store, facts.fingerprint, preset):
        rungs = ladder.rungs(store, facts.fingerprint, name, preset, facts.physical_cores or 1)
        trains = trained_with(rungs)[1] if rungs else None
        if trains and setting_hash(trains) != setting_hash(rungs[0].config):
            found += [f"# {name}", compare_line(RunConfig.from_dict(rungs[0].config), RunConfig.from_dict(trains))]
    if not found:
        return []
    cores = f" ({facts.physical_cores} physical cores)" if facts.physical_cores else ""
    return ["", "Check an answer again on this machine: its configuration against PyTorch's defaults in paired "
            "rounds until their interval decides (`cpuopt compare`: 5 to 14 rounds, each running both, so a large "
            f"model's takes long). The thread counts (`--threads`) are this machine's{cores}: on another, run "
            "`make run` there, or give its own. The `cpuopt` command is in the venv `make setup` builds:", "",
            "```sh", ". .venv/bin/activate", *found, "```"]


def _baseline_lines(table, facts: Facts, roof: dict) -> list[str]:
    """Notebook 01's table and sentences: each workload's GFLOP/s as a share of the measured fp32 GEMM
    ceiling and of the theoretical fp32 peak (``peak.peak_report``; "unknown" where cpuopt's table
    has no row for this CPU or no clock is known)."""
    from cpuopt_helpers import peak, system
    from cpuopt_helpers.stages import baseline

    ceiling = roof["gemm_gflops_best"]
    report = peak.peak_report(system.read_cpuinfo(), facts.physical_cores, roof)
    theory = report["fp32"]["theoretical_gflops"]
    lines = ["| workload | samples/s (median; range over runs) | step ms | forward | backward | optimizer | GFLOP/s "
             "| of the measured fp32 GEMM ceiling | of the theoretical fp32 peak |", "|---" * 9 + "|"]
    for name, row in table.iterrows():
        counted = row["gflops"] == row["gflops"]  # NaN: the workload's FLOPs were not counted
        shares = [f"{row['gflops'] / top:.0%}" if counted and top else "unknown" for top in (ceiling, theory)]
        gflops = f"{row['gflops']:.1f}" if counted else "unknown"
        lines.append(f"| {name} | {row['samples_per_s']:.1f} ({row['low']:.1f}-{row['high']:.1f}, {row['runs']} runs) | "
                     f"{row['step_ms']:.0f} | {row['forward_share']:.0%} | {row['backward_share']:.0%} | "
                     f"{row['optimizer_share']:.0%} | {gflops} | {' | '.join(shares)} |")
    machine = [f for f in baseline.system_findings(facts, roof) if f.kind in ("machine", "ceilings", "fresh memory")]
    source = f" (FLOP a cycle: {report['core']}, from {report['source']})" if report["source"] else ""
    peaks = [f"- The peaks the shares divide by{source}:"] + [
        f"  - {line[:12].strip()}: {line[12:].strip()}" for line in peak.peak_lines(report)]
    return lines + ["", *[f"- {f.sentence}" for f in machine], *peaks,
                    *[f"- {f.sentence}" for f in baseline.findings(table, ceiling, theory)]]


def results_page(store: ResultStore, facts: Facts, preset: str = "standard", figures: str = "docs") -> str:
    """The whole record of a workbook run, generated from its store: the baseline, the profile,
    the ladder, every confirmation of this run and each later notebook's answer, with their
    figures (linked under ``figures``)."""
    from datetime import date

    from cpuopt_helpers.stages import choosing

    machine = facts.fingerprint
    runs = last_sweep_runs(store, "01_baseline", machine, preset)
    roof = store.get_fact(machine, f"roofline/{preset}")
    if not runs or roof is None:
        raise CpuoptError(f"no {preset} results for this machine in {store.path}; run `make run` first")
    table = choosing.throughput_table(runs)
    day = measured_days(store, machine, preset) if runs else date.today().isoformat()
    commit = f", commit {run_commit(store, machine, preset)}" if run_commit(store, machine, preset) else ""
    answer, core = answer_table(store, facts, preset), core_words(facts)
    lines = [
        f"Measured on {day} by `make run` (preset `{preset}`) on **{facts.cpu_model}**"
        f"{f' ({core})' if core else ''}, {cores_words(facts)}, {facts.memory_gib} GiB, "
        f"torch {facts.versions['torch']}, oneDNN {facts.versions['onednn']}{commit}.",
        *(["", "The answer (the README's block; each part follows below):", "", *answer,
           *check_lines(store, facts, preset)] if answer else []),
        "", *_baseline_lines(table, facts, roof), "", f"![baseline]({figures}/01_baseline.png)"]
    launchers = bool(last_sweep_runs(store, "04_launchers", machine, preset))
    lines += _profile_lines(store, machine, table.index, preset) + _launcher_lines(store, machine, preset)
    from cpuopt_helpers import ladder

    ladders = list(table.index) + [n for n in ladder.workloads(store, machine, preset, "retinanet") if n not in table.index]
    lines += _precision_lines(store, machine, preset) + _ladder_lines(store, facts, ladders, preset)
    lines += _paper_lines(store, machine, preset, facts.physical_cores)
    lines += ["", f"![thread scaling]({figures}/03_scaling.png)",
              *([f"![launchers]({figures}/04_launchers.png)"] if launchers else []),
              f"![bf16 throughput]({figures}/06_throughput.png)", f"![bf16 accuracy]({figures}/06_accuracy.png)"]
    since = min(r["created_at"] for r in runs)
    lines += _confirmation_lines(store, machine, preset, since)
    said = loaded_sentence([r for r in store.results(machine=machine) if r.get("created_at", "") >= since])
    lines += ["", said] if said else []
    lines += wall_time_lines(store, machine, preset, since)
    lines += _answer_lines(Path(store.path).parent / "notebooks", figures, tabulated(store, machine, preset))
    return "\n".join(lines)


def wall_time_lines(store: ResultStore, machine: str, preset: str, since: str) -> list[str]:
    """The wall time of the `cpuopt workbook run` that measured the page's baseline (its first run
    at ``since``), notebook by notebook; nothing where no kept run did (an older store, or a
    baseline measured apart)."""
    from cpuopt_helpers.wording import duration_words

    runs = store.get_fact(machine, TIMES_FACT.format(preset=preset)) or []
    run = next((r for r in reversed(runs) if r["started_at"] <= since <= r["finished_at"]), None)
    if run is None:
        return []
    books = run["notebooks"]
    rows = [f"| {b['notebook'].removesuffix('.ipynb')} | {b['status']} | {duration_words(b['seconds'])} |"
            for b in books]
    total = duration_words(sum(b["seconds"] for b in books))
    return ["", f"Wall time: the run that measured this page took {total} for {len(books)} notebook(s), from "
            f"{run['started_at'][:16].replace('T', ' ')} UTC (setup and this page not included).", "",
            "| notebook | status | wall time |", "|---|---|---|", *rows, f"| all | | {total} |"]


def last_sweep_runs(store: ResultStore, tag: str, machine: str, preset: str | None = None) -> list[dict]:
    """The results of the latest sweep with this tag (of this preset): a re-run notebook's
    sweep replaces the earlier one in the README, never mixes with it."""
    sweeps = [s for s in store.sweeps(kind="sweep", machine=machine) if s["tag"] == tag
              and (preset is None or any(arm["preset"] == preset for arm in s["arms"]))]
    return store.results(sweep=sweeps[-1]["id"]) if sweeps else []


def _confirmation_lines(store: ResultStore, machine: str, preset: str, since: str) -> list[str]:
    """Every adaptive A/B of this run (of its preset, measured since its baseline, by a notebook:
    not the command line's): what was confirmed against what, in how many rounds, and why it
    stopped (the verdict, or the budget) - what the time budget allowed."""

    rows = []
    for sweep in store.sweeps(kind="ab", machine=machine):
        if (sweep["tag"] or "").startswith("cli-") or sweep["arms"][0].get("preset") != preset:
            continue
        runs = [r for r in store.results(sweep=sweep["id"]) if r["status"] == "ok" and r["created_at"] >= since]
        by = {(r["arm"], r["round"]): r["samples_per_s"] for r in runs}
        rounds = sorted({k[1] for k in by if (0, k[1]) in by and (1, k[1]) in by})
        if not rounds:
            continue
        design = store.get_fact(machine, f"ab/{sweep['id']}") or {}  # as it ran (older stores: the defaults)
        result = compare.sequential_ratio([by[(0, i)] for i in rounds], [by[(1, i)] for i in rounds],
                                          design.get("min_rounds", compare.MIN_ROUNDS),
                                          design.get("max_rounds", compare.MAX_ROUNDS))
        a, b = sweep["arms"]
        change = setting_label(b, a)
        ladder = store.ladder(machine, a["workload"], preset)  # its first rung: this run's PyTorch's defaults
        against = ("the incumbent" if not ladder else "PyTorch's defaults"
                   if setting_hash(a) == setting_hash(ladder[0]["config"]) else setting_label(a, ladder[0]["config"]))
        rows.append(f"| {(sweep['tag'] or '').split('/')[0]} | {a['workload']} | {against} | {change} | "
                    f"{compare.describe(result)} |")
    if not rows:
        return []
    return ["", "Every confirmation of this run: a change against the configuration it would replace (a screening "
            "winner against the incumbent; in notebook 09, the ladder's top against PyTorch's defaults), in fresh "
            "paired rounds, as many as the notebook's MIN_ROUNDS, MAX_ROUNDS and BUDGET_MIN allowed; each interval "
            "is the one its comparison decided by (a sequential comparison's is wider than a fixed one's).", "",
            "| notebook | workload | against | change | ratio, interval, rounds: verdict |", "|---|---|---|---|---|",
            *rows]


ANSWERS = {"05_ipex": ("IPEX and its upstream replacements (notebook 05)", ["05_runtimes"]),
           "06_bf16": ("bf16, its speed and its accuracy on the digits model (notebook 06; its figures above)", []),
           "07_multi_instance": ("Multi-instance and DDP (notebook 07)", ["07_layouts", "07_convergence"]),
           "08_case_study_retinanet": ("The RetinaNet case study (notebook 08)", ["08_ladder", "08_frozen_layers"]),
           "09_summary": ("The ladder (notebook 09)", ["09_ladder"])}


def notebook_answer(path: Path, leave_out: set[str] = frozenset()) -> list[str]:
    """The findings a notebook printed in its last code cell (its answer), one per line, each under
    the last section heading it printed before it (a line ending in ':'), set apart as markdown
    needs; ``leave_out``: sentences not to quote (a table of the page shows them). A heading goes
    where none of its findings is quoted; other prints (progress, warnings) are left out."""
    import nbformat

    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    text = "".join(o.get("text", "") for o in (cells[-1].get("outputs", []) if cells else [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")  # not progress bars
    out: list[str] = []
    heading = None
    for line in text.replace("\r", "\n").splitlines():
        if line.startswith("- "):
            if line[2:] in leave_out:
                continue
            if heading:  # the section's first quoted finding: its heading before it
                out += ["", f"*{heading}*", ""]
                heading = None
            out.append(line)
        elif line.strip().endswith(":"):
            heading = line.strip().replace("*", "\\*").replace("_", "\\_")
    return out[1:] if out[:1] == [""] else out


def tabulated(store: ResultStore, machine: str, preset: str) -> set[str]:
    """The sentences of this run's findings that a table on its page already shows: its quoted answers
    leave them out. Notebook 06's bf16 settings of each workload the bf16 table gives; notebook 08's
    fixes screened against its baseline whose rows the paper table gives (``case_study.paper_table``'s
    arms). Each as the notebook printed it (``Session.tell`` keeps it); a record from before it did, as
    its template words it now, and none where the template can no longer word it (quoted as printed)."""
    from cpuopt_helpers.decisions import Finding
    from cpuopt_helpers.stages.case_study import UNFIXED

    def told(stage: str) -> list[tuple[Finding, str | None]]:  # what the notebook told, as records, and said
        return [(Finding.from_dict(d), d.get("said")) for d in store.get_fact(machine, f"notes/{stage}/{preset}", [])]

    arms = {r["arm"]: r.get("workload") for r in store.get_fact(machine, f"case-study/paper/{preset}") or []
            if isinstance(r.get("arm"), str)}  # a row timed alone has none (None, or NaN from the table)

    def in_paper(f: Finding) -> bool:  # a fix a row of the paper table gives, of its workload (None: an older row)
        arm = f.values.get("name") if f.kind == "arm over first" else UNFIXED if f.kind == "frozen backward skipped" \
            else None
        return arm in arms and arms[arm] in (f.workload, None)

    in_table = {r["config"]["workload"] for r in last_sweep_runs(store, "06_bf16", machine)}  # _precision_lines'
    shown = [(f, s) for f, s in told("precision") if f.kind in ("screened only", "bf16 over fp32")
             and f.workload in in_table]
    shown += [(f, s) for f, s in told("case_study") if in_paper(f)]
    sentences = set()
    for f, said in shown:
        try:
            sentences.add(said or f.sentence)
        except (KeyError, TypeError, ValueError):  # a record of an older schema: nothing to match, nothing left out
            continue
    return sentences


def _answer_lines(folder: Path, figures: str, leave_out: set[str] = frozenset()) -> list[str]:
    """Each later notebook's answer, quoted from the executed notebook, with its figures; ``leave_out``:
    findings a table of the page shows (``tabulated``), said where some were."""
    lines = []
    for stem, (title, pngs) in ANSWERS.items():
        path = folder / f"{stem}.ipynb"
        if not path.exists():
            continue
        quoted, whole = notebook_answer(path, leave_out), notebook_answer(path)
        left = (" (the findings a table above gives are not repeated)" if quoted != whole else "") + (
            ": every finding it printed is in a table above." if whole and not quoted else ":")
        lines += ["", f"{title}, as the executed notebook concluded{left}", "", *quoted]
        lines += ["", *[f"![{f}]({figures}/{f}.png)" for f in pngs]] if pngs else []
    return lines


def _precision_lines(store: ResultStore, machine: str, preset: str) -> list[str]:
    from cpuopt_helpers.stages import choosing

    runs = last_sweep_runs(store, "06_bf16", machine)
    if not runs:
        return []
    references = {}
    for w in dict.fromkeys(r["config"]["workload"] for r in runs):
        references[w] = min((r for r in runs if r["config"]["workload"] == w), key=lambda r: r["arm"])["config"]
    named = "; ".join(f"{w}: {setting_label(c, RunConfig.for_preset(w, c['preset']).to_dict()) or 'the defaults'}"
                      for w, c in references.items())
    quick = any(c["preset"] != preset for c in references.values())  # no bf16 fast path: notebook 06 moves to quick
    where = "; at the quick preset, since this CPU has no bf16 fast path and bf16 runs slowly" if quick else ""
    lines = ["", "bf16 autocast and the layout, each against fp32 as notebook 05 handed it on (notebook 06, loss in "
             f"fp32{where}; {named}). Screening rounds: the winner's confirmation is in the table of confirmations "
             "below.", "",
             "| workload | setting | against fp32 as handed on |", "|---|---|---|"]
    for w, first in references.items():
        for _, row in choosing.compare_configs(runs, first, w).iterrows():
            if isinstance(row.get("comparison"), dict):
                lines.append(f"| {w} | {row['setting']} | {compare.describe(row['comparison'])} |")
        for r in runs:
            if r["config"]["workload"] == w and r["status"] == "unsupported" and r["round"] == 0:
                reason = r["reason"].splitlines()[-1].replace("cpuopt worker: ", "")[:140]
                lines.append(f"| {w} | {setting_label(r['config'], first)} | {reason} |")
    return lines


def _ladder_lines(store: ResultStore, facts: Facts, workloads, preset: str) -> list[str]:
    from cpuopt_helpers import compare, ladder

    lines = ["", "The optimisation ladder: what each notebook handed on (a step that kept the previous "
             "configuration says so), and the last rung over PyTorch's defaults (`cpuopt ladder` prints it).", "",
             "| workload | ladder | over PyTorch's defaults |", "|---|---|---|"]
    for w in workloads:
        rungs = ladder.rungs(store, facts.fingerprint, w, preset, facts.physical_cores)
        if not rungs:
            continue
        steps = " -> ".join(f"{r.step}: {r.change}" for r in rungs[1:])
        chained, end = rungs[-1].vs_baseline, ladder.top_end_to_end(rungs)
        over = (f"{end.describe()} (the top against the defaults in fresh paired rounds)" if end else
                compare.describe(chained) if any(not r.kept for r in rungs[1:])
                else "1.00x: every stage kept PyTorch's defaults")
        lines.append(f"| {w} | baseline -> {steps} | {over} |" if steps else f"| {w} | baseline (nothing handed on) | |")
    return lines if len(lines) > 5 else []


def _paper_lines(store: ResultStore, machine: str, preset: str, physical_cores: int) -> list[str]:
    """Notebook 08's table: the paper's RetinaNet numbers beside this machine's. Its overall row is
    the ladder's top against PyTorch's defaults in fresh paired rounds where notebook 09 (or a
    climb) measured that after notebook 08 screened it: the README's ladder table says the same."""
    from cpuopt_helpers import ladder

    rows = store.get_fact(machine, f"case-study/paper/{preset}")
    if not rows:
        return []
    top = ladder.top_end_to_end(ladder.rungs(store, machine, "retinanet", preset, physical_cores))
    if top:
        rows = [dict(r, **{"here, worded": top.describe(), "why": f"the ladder's top against PyTorch's defaults in "
                           f"fresh paired rounds (`cpuopt ladder`); notebook 08: {r['here, worded']}"})
                if r["fix"] == "overall" and r["here, worded"] != top.describe() else r for r in rows]
    lines = ["", "The paper's RetinaNet numbers beside this machine's (notebook 08; ratios, an interval where the run "
             "had the rounds for one; a kernel alone gains more than the step it is part of):", "",
             "| fix | the paper | here | measured as | why (this run's data) |", "|---|---|---|---|---|"]
    for r in rows:
        paper = f"{r['paper']:.2f}x" if r["paper"] and r["paper"] == r["paper"] else "-"  # None, or NaN from a table
        lines.append(f"| {r['fix']} | {paper} | {r['here, worded']} | {r.get('measured as', '')} | {r['why']} |")
    return lines


def _profile_lines(store: ResultStore, machine: str, workloads, preset: str) -> list[str]:
    rows = [(w, store.get_fact(machine, f"profile/{w}/{preset}")) for w in workloads]
    rows = [(w, p) for w, p in rows if p]
    if not rows:
        return []
    lines = ["", "ProfileDNN (notebook 02): share of the measured step in oneDNN primitives, and the efficiency "
             "ratio (replayed kernel-only time / measured step). The step is the profile's own plain run, one run "
             "apart from notebook 01's median above, so the two differ by the runs' noise.", "",
             "| workload | step ms (its plain run) | oneDNN share of the step (logged run) | efficiency ratio | "
             "operator spans per step |", "|---|---|---|---|---|"]
    for w, p in rows:
        eff = f"{p['efficiency']:.0%}" if p.get("efficiency") is not None else "n/a"
        spans = f"{p['ops_per_step']:.0f}" if p.get("ops_per_step") is not None else "n/a"
        lines.append(f"| {w} | {p['step_ms']:.1f} | {p['coverage']:.0%} | {eff} | {spans} |")
    return lines


def _launcher_lines(store: ResultStore, machine: str, preset: str) -> list[str]:
    from cpuopt_helpers.stages import choosing

    runs = last_sweep_runs(store, "04_launchers", machine, preset)
    if not runs:
        ran = ("its allocator stage ran (its verdict: the ladder and the confirmations below); "
               if last_sweep_runs(store, "04_allocator", machine, preset) else "")
        return ["", f"Launchers (notebook 04): {ran}its comparison of the best setting with PyTorch's and `run_cpu`'s "
                f"defaults runs only in the full preset, not in the {preset} one (`make run PRESET=full`)."]
    lines = ["", "Threading, allocator and launchers (notebooks 03-04): the best setting handed on, as a ratio to "
             "PyTorch's defaults measured in interleaved rounds, next to `run_cpu`'s defaults.", "",
             "| workload | setting | vs PyTorch's defaults |", "|---|---|---|"]
    notes = []
    for w in dict.fromkeys(r["config"]["workload"] for r in runs):
        default = min((r for r in runs if r["config"]["workload"] == w), key=lambda r: r["arm"])["config"]
        table = choosing.compare_configs(runs, default, w)
        for _, row in table.iterrows():
            comparison = row.get("comparison") if isinstance(row.get("comparison"), dict) else None
            if not row["runs"]:  # an arm that never finished: its row says how it failed
                lines.append(f"| {w} | {row['setting']} | {row['verdict']} |")
                continue
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
    problem = check_readme(readme, section)
    if problem and "differs" not in problem:
        raise CpuoptError(f"{problem}; give the README of this repository (its block is where the answer goes)")
    text = readme.read_text()
    start, end = text.index(RESULTS_START) + len(RESULTS_START), text.index(RESULTS_END)
    readme.write_text(text[:start] + "\n" + section + "\n" + text[end:])


def cpu_slug(facts: Facts) -> str:
    """The CPU model as a page name's part: lower case, without the trademark marks and the words
    that name no model ("Intel(R) Xeon(R) Processor @ 2.80GHz": intel-xeon-2-80ghz), runs of
    other characters as one dash."""
    words = re.sub(r"\((r|tm)\)|\b(processor|cpu)\b", " ", facts.cpu_model.lower())
    return re.sub(r"[^a-z0-9]+", "-", words).strip("-") or "cpu"


def words_link(page: Path, targets: bool = False) -> str:
    """A link to what the page's words mean, where the page sits beside the docs (docs/results/);
    ``targets``: the page checks the case study's targets, and links where they come from."""
    docs = page.parent.parent
    said = (" What its words mean: [how it measures](../measuring.md#words-the-pages-use)."
            if (docs / "measuring.md").exists() else "")
    if targets and (docs / "case-study.md").exists():
        said += " Its targets, and where they come from: [the case study](../case-study.md#targets)."
    return said


INDEX_TITLE = "# Results pages, by day"  # the first line of the index this module writes
PAGE_NAME = r"(\d{4}-\d{2}-\d{2})-(.+)\.md"  # DAY-CPU-ISA[-NAME].md: every dated page's name


def _page_entry(page: Path) -> tuple[str, str]:
    """(the machine, what measured it) from a dated page's title: "Results: CPU (ISA), DAY, preset P"
    (make run's page) or "WHAT: CPU (ISA), DAY" (a record's)."""
    lines = page.read_text().splitlines()
    title = lines[0].lstrip("# ").strip() if lines else page.stem
    what, _, rest = title.partition(": ")
    machine, _, tail = rest.rpartition(", ")
    if tail.startswith("preset "):  # make run's: "CPU (ISA), DAY, preset P"
        return machine.rpartition(", ")[0], f"make run, {tail}"
    return machine or page.stem, what


def day_pages(folder: Path, day: str) -> list[tuple[str, str, Path]]:
    """The dated pages of one day in FOLDER: (machine, what measured it, path), by machine."""
    found = [p for p in sorted(Path(folder).glob(f"{day}-*.md")) if re.fullmatch(PAGE_NAME, p.name)]
    return sorted(((*_page_entry(p), p) for p in found),  # make run's standard page first, then its other presets
                  key=lambda e: (e[0], not e[1].startswith("make run"), e[1] != "make run, preset standard", e[2].name))


def results_index(folder: Path) -> str:
    """FOLDER/index.md's text: every dated page, by day (newest first) and machine, so that a day's
    pages (make run's, make test's, the RetinaNet studies') are read together."""
    days = sorted({m.group(1) for p in Path(folder).glob("*.md") if (m := re.fullmatch(PAGE_NAME, p.name))},
                  reverse=True)
    lines = [INDEX_TITLE, "",
             "Every dated page a measuring command wrote here, newest day first, each day's pages by machine. "
             "Each page is stamped with its machine, day and commit; pages of different machines or days are "
             "separate records, never merged."]
    if not days:
        lines += ["", "No dated page yet: `make run` writes the first."]
    for day in days:
        lines += ["", f"## {day}", ""]
        machines: dict[str, list[str]] = {}
        for machine, what, page in day_pages(folder, day):
            machines.setdefault(machine, []).append(f"[{what}]({page.name})")
        lines += [f"- {machine}: {' · '.join(links)}" for machine, links in machines.items()]
    return "\n".join(lines) + "\n"



def write_index(folder: Path) -> Path:
    """Rewrite FOLDER/index.md from the pages there (each page writer calls it); an index.md there that
    this did not write (a hand-written contents page) is refused, not overwritten."""
    index = Path(folder) / "index.md"
    if not Path(folder).is_dir():
        raise CpuoptError(f"{folder} is not a folder of dated pages: name the folder they are in (docs/results)")
    if index.exists() and not index.read_text().startswith(INDEX_TITLE):
        raise CpuoptError(f"{index} is not the index of dated pages (it does not start with {INDEX_TITLE!r}): "
                          "write the pages into a folder of their own (docs/results)")
    index.write_text(results_index(folder))
    return index


def machine_words(facts: Facts) -> str:
    """The machine as a dated page's title names it: 'CPU model (ISA)'."""
    return f"{facts.cpu_model} ({isa_slug(facts)})"


def day_links(page: Path, machine: str) -> str:
    """' This machine's earlier pages of DAY: ... Every page by day: ...': links from a dated page
    (of ``machine``, ``machine_words``) to that day's pages of it written before it, and to the
    index, which lists them all."""
    name = re.fullmatch(PAGE_NAME, page.name)
    if not name:
        return ""
    others = [f"[{what}]({p.name})" for m, what, p in day_pages(page.parent, name.group(1))
              if p.name != page.name and m == machine]
    return ((f" This machine's earlier pages of {name.group(1)}: {', '.join(others)}." if others else "")
            + " Every page by day: [the index](index.md).")


def isa_slug(facts: Facts) -> str:
    """The widest vector level of a machine, for a page's name: amx, avx512, avx2 or sse."""
    isa = facts.isa
    return "amx" if isa.get("amx_bf16") else "avx512" if isa.get("avx512f") else "avx2" if isa.get("avx2") else "sse"


def page_day(store: ResultStore, facts: Facts, preset: str) -> str:
    runs = last_sweep_runs(store, "01_baseline", facts.fingerprint, preset)
    return max(r["created_at"] for r in runs)[:10] if runs else "undated"


def page_stem(store: ResultStore, facts: Facts, preset: str) -> str:
    """The run's page name without .md: DAY-CPU-ISA, and -PRESET for a preset other than standard."""
    stem = f"{page_day(store, facts, preset)}-{cpu_slug(facts)}-{isa_slug(facts)}"
    return stem if preset == "standard" else f"{stem}-{preset}"


def write_results_page(store: ResultStore, facts: Facts, preset: str, folder: Path, figures: Path) -> Path:
    """The run's page as a dated record: FOLDER/DAY-CPU-ISA.md with its figures copied beside it
    (FOLDER/DAY-CPU-ISA/), stamped with the machine, the day, the preset and the command that
    regenerates it. Another machine's or day's page is another file, never merged."""
    import shutil

    stem, day = page_stem(store, facts, preset), page_day(store, facts, preset)
    body = results_page(store, facts, preset, figures=stem)
    (folder / stem).mkdir(parents=True, exist_ok=True)
    kept = []
    for line in body.splitlines():
        png = re.fullmatch(r"!\[[^]]*\]\(" + re.escape(stem) + r"/([\w.-]+\.png)\)", line)
        if png and not (figures / png.group(1)).exists():
            continue  # a figure this run did not draw
        if png:
            shutil.copyfile(figures / png.group(1), folder / stem / png.group(1))
        kept.append(line)
    page = folder / f"{stem}.md"
    page.write_text(f"# Results: {machine_words(facts)}, {day}, preset {preset}\n\n"
                    + "\n".join(kept) + f"\n\nWritten by `cpuopt workbook readme --preset {preset} --page "
                    f"{folder}` from the results store, after `make run`; a page of another machine or day is "
                    f"another file.{words_link(page, 'Target for ' in body)}{day_links(page, machine_words(facts))}\n")
    write_index(folder)
    return page


def check_readme(readme: Path, section: str) -> str | None:
    """None when README's generated block is what the store gives now, byte for byte; else which block differs."""
    try:
        text = readme.read_text()
    except OSError as exc:
        return f"cannot read {readme}: {exc.strerror or exc}"
    if RESULTS_START not in text or RESULTS_END not in text:
        return f"{readme} has no {RESULTS_START} ... {RESULTS_END} block"
    start, end = text.index(RESULTS_START) + len(RESULTS_START), text.index(RESULTS_END)
    return None if text[start:end] == "\n" + section + "\n" else f"{readme}: the results block differs from the store"
