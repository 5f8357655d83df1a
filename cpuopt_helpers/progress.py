"""Progress bars for the long runs: sweeps, comparisons, searches."""

from __future__ import annotations

import os
import warnings

HEADLESS = "CPUOPT_HEADLESS"  # set by `cpuopt workbook run` for the kernels of the notebooks it executes


def bar(**kwargs):
    """A tqdm bar: a widget in JupyterLab where ipywidgets is installed, else text (without tqdm's
    warning that it is not). Disabled in a notebook that `cpuopt workbook run` executes: nobody
    watches its cells, and its bars would stay in the executed notebook and the report as lines of
    debris (the workbook's own bar and papermill's show the run's progress)."""
    if os.environ.get(HEADLESS) == "1":
        kwargs["disable"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tqdm.auto in a kernel without ipywidgets: "IProgress not found"
        from tqdm.auto import tqdm
    return tqdm(**kwargs)
