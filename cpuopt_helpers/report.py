"""The workbook's report: BUILD/report/index.html from what a run left in BUILD.

One page that opens with the answer (per workload and preset: the best confirmed
configuration, its speedup over PyTorch's defaults with its interval, and the command that
trains with it), then the machine's facts, a gallery of every figure, the results table (one row
per configuration and notebook: median samples/s with its spread) and links to every
executed notebook rendered to HTML (nbconvert). Figures are copied beside the page, so
the folder can be moved or served as it is. A small script on the page records, once it
has loaded, how many figures the browser could draw (``data-figures-loaded="N/M"`` on
<body>), which the browser test reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import html
import shutil
from pathlib import Path

from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.results import ResultStore
from cpuopt_helpers.system import Facts, numa_words

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2rem; }
table { border-collapse: collapse; font-size: 0.85rem; } td, th { border: 1px solid #ddd; padding: 0.2rem 0.5rem; }
th { background: #f4f4f4; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.gallery { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 1rem; }
figure { margin: 0; border: 1px solid #eee; padding: 0.5rem; } figure img { width: 100%; }
figcaption { font-size: 0.8rem; color: #555; }
"""
CHECK_SCRIPT = """
window.addEventListener("load", () => {
  const imgs = [...document.querySelectorAll("img")];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.figuresLoaded = ok + "/" + imgs.length;
});
"""


def _facts_rows(facts: Facts) -> list[tuple[str, str]]:
    v, bf16 = facts.versions, facts.bf16
    isa = ", ".join(k for k, on in facts.isa.items() if on) or "none of those checked"
    return [("CPU", facts.cpu_model),
            ("cores", f"{facts.physical_cores} physical, {facts.logical_cores} logical, "
                      f"{facts.sockets} socket(s), {numa_words(facts.numa_nodes)}"),
            ("ISA", isa), ("memory", f"{facts.memory_gib} GiB"),
            ("software", f"python {v.get('python')}, torch {v.get('torch')}, oneDNN {v.get('onednn')}"),
            ("bf16", f"{'accelerated' if bf16.get('accelerated') else 'not accelerated'}: {bf16.get('reason', '')}"),
            ("allocators", ", ".join(f"{k}: {p or 'missing'}" for k, p in facts.allocators.items())),
            ("machine id", facts.fingerprint or "?")]


def results_rows(store: ResultStore) -> list[dict]:
    """One row per (notebook tag, configuration): runs, median samples/s, its range, status."""
    df = store.load()
    if df.empty:
        return []
    rows = []
    for (tag, label), g in df.groupby(["tag", "label"], sort=False, dropna=False):
        ok = g[g["status"] == "ok"]
        rows.append({"notebook": tag or "", "configuration": label, "runs": len(g), "ok": len(ok),
                     "samples_per_s": ok["samples_per_s"].median() if len(ok) else None,
                     "min": ok["samples_per_s"].min() if len(ok) else None,
                     "max": ok["samples_per_s"].max() if len(ok) else None,
                     "step_ms": ok["step_ms"].median() if len(ok) else None})
    return rows


def answer_rows(store: ResultStore, facts: Facts) -> list[list[str]]:
    """Per ladder in the store: workload, preset and its answer as the README gives it
    (``pages.answer``: the configuration, the headline over PyTorch's defaults, the command)."""
    from cpuopt_helpers import ladder, pages

    machine = facts.fingerprint
    rows = []
    for name in store.fact_names(machine, "ladder/"):
        _, workload, preset = name.split("/")
        rungs = ladder.rungs(store, machine, workload, preset, facts.physical_cores or 1)
        if rungs:
            rows.append([workload, preset, *pages.answer(rungs)])
    return rows


def _table(header: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            text = "" if value is None else (f"{value:,.1f}" if isinstance(value, float) else str(value))
            cells.append(f"<td class='num'>{html.escape(text)}</td>" if i in numeric else f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_notebooks(notebooks: list[Path], target: Path) -> list[tuple[str, str]]:
    """Each executed notebook to HTML (outputs kept, code shown); (name, relative link)."""
    import nbformat
    from nbconvert import HTMLExporter

    target.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter()
    exporter.log.setLevel("ERROR")  # no warning per notebook that its figures lack alternative text
    links = []
    for nb_path in notebooks:
        try:
            node = nbformat.read(nb_path, as_version=4)
        except ValueError:  # half-written JSON: another run on this folder is writing it (its report renders it)
            links.append((f"{nb_path.stem} (being written by another run; its report has it)", ""))
            continue
        body, _ = exporter.from_notebook_node(node)
        (target / f"{nb_path.stem}.html").write_text(body)
        links.append((nb_path.stem, f"notebooks/{nb_path.stem}.html"))
    return links


MARK = ".cpuopt-report"  # the report folders cpuopt wrote, which it may replace


def written_by_cpuopt(folder: Path) -> bool:
    """Marked as cpuopt's, or a report of a cpuopt from before the mark (its page runs the figure check)."""
    index = folder / "index.html"
    return (folder / MARK).exists() or (index.exists() and "figuresLoaded" in index.read_text(errors="replace"))


@contextlib.contextmanager
def report_lock(build: Path):
    """One report writer at a time on BUILD: two workbook runs on one folder each end with a report."""
    if not build.exists():
        build.mkdir(parents=True)
    with open(build / ".report.lock", "w") as lock:  # a file given as the folder: "Not a directory"
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_report(build: Path, facts: Facts, store: ResultStore | None = None, title: str = "cpuopt report") -> Path:
    """Write BUILD/report/index.html (and its figures and notebook pages); return its path."""
    with report_lock(build):
        return _write_report(build, facts, store, title)


def _write_report(build: Path, facts: Facts, store: ResultStore | None, title: str) -> Path:
    report = build / "report"
    figures_out = report / "figures"
    if report.exists():
        if not written_by_cpuopt(report):  # never delete a folder cpuopt did not write
            raise CpuoptError(f"{report} exists and was not written by cpuopt; move it away or give another --out")
        shutil.rmtree(report)
    figures_out.mkdir(parents=True)
    (report / MARK).write_text("written by `cpuopt workbook report`; cpuopt replaces this folder on the next report\n")
    figures = sorted((build / "figures").glob("*.png")) if (build / "figures").exists() else []
    for fig in figures:
        shutil.copy2(fig, figures_out / fig.name)
    notebooks = sorted((build / "notebooks").glob("[0-9][0-9]_*.ipynb")) if (build / "notebooks").exists() else []
    links = render_notebooks(notebooks, report / "notebooks")
    store = store or ResultStore(build / "results.sqlite")
    rows = results_rows(store)
    answers = answer_rows(store, facts)
    gallery = "".join(f"<figure><img src='figures/{html.escape(f.name)}' alt='{html.escape(f.stem)}'>"
                      f"<figcaption>{html.escape(f.stem)}</figcaption></figure>" for f in figures)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{STYLE}</style>
<script>{CHECK_SCRIPT}</script></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{len(notebooks)} executed notebooks, {len(figures)} figures, {sum(r['runs'] for r in rows)} measured runs.</p>
<h2>The answer</h2>
{_table(["workload", "preset", "confirmed configuration", "over PyTorch's defaults", "measure it yourself"], answers)
 if answers else '<p>No ladder in the store yet: run the notebooks (make run).</p>'}
<h2>Machine</h2>
{_table(["fact", "value"], [list(r) for r in _facts_rows(facts)])}
<h2>Notebooks</h2>
<ul>{''.join(f"<li><a href='{html.escape(link)}'>{html.escape(name)}</a></li>" if link
              else f"<li>{html.escape(name)}</li>" for name, link in links)}</ul>
<h2>Figures</h2>
<div class="gallery">{gallery or '<p>No figures yet.</p>'}</div>
<h2>Results</h2>
{_table(["notebook", "configuration", "runs", "ok", "samples/s (median)", "min", "max", "step ms"],
        [[r[k] for k in ("notebook", "configuration", "runs", "ok", "samples_per_s", "min", "max", "step_ms")]
         for r in rows], numeric={2, 3, 4, 5, 6, 7})}
</body></html>
"""
    index = report / "index.html"
    index.write_text(page)
    return index
