"""The docs site (`make docs`): README.md as its home page, the hand-written pages under docs/,
the generated results pages (docs/results/) and the last run's report with its executed
notebooks, built by MkDocs offline, in strict mode, into BUILD/site.

``source(root, build)`` lays the pages out for MkDocs in BUILD/docs-src (the README's links
into docs/ and the pages' links back to it rewritten to the site's own names) and writes
BUILD/mkdocs.yml; ``python -m cpuopt_helpers.site`` does it and prints that config's path.
Nothing here is measured: the figures on the pages are the ones the commands that measured
them wrote.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from cpuopt_helpers.report import CHECK_SCRIPT

ORDER = ("install", "notebooks", "own-model", "cli", "machines", "case-study", "profiledn", "measuring",
         "contributing")  # the hand-written pages, in the README's "Read on" order


def _title(page: Path) -> str:
    first = page.read_text().lstrip().splitlines()[0] if page.read_text().strip() else page.stem
    return first.lstrip("# ").strip() or page.stem


def _links(text: str, rename: dict[str, str]) -> str:
    """Markdown links whose target is a key of ``rename`` point to its value instead (anchors kept)."""
    return re.sub(r"\]\(([^)#\s]+)(#[^)\s]*)?\)",
                  lambda m: f"]({rename.get(m.group(1), m.group(1))}{m.group(2) or ''})", text)


def source(root: Path, build: Path, results: Path | None = None) -> Path:
    """Lay out BUILD/docs-src and write BUILD/mkdocs.yml; return the config's path (``results``:
    the folder of generated results pages, by default ROOT/docs/results)."""
    docs, src = root / "docs", build / "docs-src"
    results_dir = results or docs / "results"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    pages = {p.stem: p for p in sorted(docs.glob("*.md"))}
    results = sorted(results_dir.glob("*.md")) if results_dir.exists() else []
    readme = {f"docs/{p.name}": ("contents.md" if p.stem == "index" else p.name) for p in pages.values()}
    readme |= {f"docs/results/{p.name}": f"results/{p.name}" for p in results}  # the block's link to the run's page
    home = _links((root / "README.md").read_text(), readme)
    home = re.sub(r"\[([^\]]*)\]\(docs/results/[^)]*\)", r"`\1`", home)  # a page this site lacks: named, not linked
    (src / "index.md").write_text(home)
    for stem, page in pages.items():
        name = "contents.md" if stem == "index" else page.name
        (src / name).write_text(_links(page.read_text(), {"../README.md": "index.md", "index.md": "contents.md"}))
    for png in docs.glob("*.png"):
        shutil.copyfile(png, src / png.name)
    if results:
        shutil.copytree(results_dir, src / "results")
    report = build / "report"
    if (report / "index.html").exists():
        shutil.copytree(report, src / "report")  # the last run's report and its executed notebooks, as they are
    (src / "figures.js").write_text(CHECK_SCRIPT)
    nav = ["  - Home: index.md", "  - Contents: contents.md",
           *[f"  - '{_title(pages[s])}': {s}.md" for s in ORDER if s in pages],
           *[f"  - '{s}': {pages[s].name}" for s in pages if s not in ORDER and s != "index"]]
    if results:
        nav += ["  - Results:", *[f"    - '{'By day' if p.stem == 'index' else p.stem}': results/{p.name}"
                                  for p in sorted(results, key=lambda p: p.stem != "index")]]  # the index first
    config = build / "mkdocs.yml"
    config.write_text("\n".join([
        "site_name: cpuopt", f"docs_dir: {src}", f"site_dir: {build / 'site'}", "use_directory_urls: false",
        "theme:", "  name: mkdocs", "  highlightjs: false", "  locale: en",  # offline: nothing from a CDN
        "extra_javascript:", "  - figures.js", "plugins: []", "nav:", *nav, ""]))
    return config


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    build = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else root / "build"
    print(source(root, build))
