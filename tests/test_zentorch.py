"""zentorch, AMD's torch.compile backend: whether it fits this torch, what `cpuopt doctor` and
notebook 05 say about it on each vendor's CPU, and its findings (made-up runs)."""

from importlib import metadata

import pytest

from cpuopt_helpers.system import Facts
from cpuopt_helpers import planning, runtimes, system
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.decisions import Finding, Plan
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.stages import extensions
from tests.test_stages import result


def test_each_zentorch_release_fits_one_torch_release():
    assert runtimes.zentorch_mismatch("2.13.0+cpu", "2.13.0.2") is None
    why = runtimes.zentorch_mismatch("2.13.0+cpu", "2.14.0.1")
    assert "zentorch 2.14.0.1 is built for torch 2.14.0" in why and "pip install 'zentorch==2.13.0.*'" in why


def installed(monkeypatch, zentorch: str | None, torch: str = "2.13.0+cpu"):
    def version(name):
        found = {"torch": torch, "zentorch": zentorch}.get(name)
        if found is None:
            raise metadata.PackageNotFoundError(name)
        return found

    monkeypatch.setattr(metadata, "version", version)


def test_its_status_says_what_is_missing_or_why_it_was_not_tried(monkeypatch):
    installed(monkeypatch, None)
    missing = runtimes.zentorch_status("AuthenticAMD")
    assert not missing["usable"] and missing["amd"] and "pip install 'zentorch==2.13.0.*'" in missing["reason"]
    installed(monkeypatch, "2.13.0.2")
    assert runtimes.zentorch_status("AuthenticAMD") == {"version": "2.13.0.2", "usable": True, "amd": True, "reason": ""}
    intel = runtimes.zentorch_status("GenuineIntel")
    assert intel["usable"] and intel["reason"].startswith("not tried: this CPU is GenuineIntel")
    assert "zentorch: not tried" not in runtimes.vendor_extension("AuthenticAMD")
    assert runtimes.vendor_extension("AuthenticAMD").endswith(
        "zentorch 2.13.0.2 installed, fits this torch; not measured on this machine yet (notebook 05, `make run PRESET=full`)")
    measured = {"preset": "quick", "date": "2026-12-01", "lines": ["cnn: zentorch over stock eager: 1.2x (1.1-1.3).",
                                                                   "cnn: IPEX over its own stock torch 2.8: 0.4x."]}
    assert runtimes.vendor_extension("AuthenticAMD", measured=measured).endswith(
        "fits this torch; measured here by notebook 05 (quick preset, 2026-12-01): cnn: zentorch over stock eager: "
        "1.2x (1.1-1.3).")
    assert runtimes.vendor_extension("GenuineIntel", {"available": True}, measured).endswith(
        "its runtime is built; measured here by notebook 05 (quick preset, 2026-12-01): cnn: IPEX over its own stock "
        "torch 2.8: 0.4x.")
    import pandas as pd

    from cpuopt_helpers.config import RunConfig

    stock = RunConfig(threads=2)  # the vendor's extension's findings come from the plan, not from matching sentences
    plan = Plan.of({"torch (stock)": stock, "torch 2.8 (stock)": stock.replace(runtime="ipex"),
                    "torch 2.8 + IPEX": stock.replace(runtime="ipex", ipex=True)})
    runs = [{"status": "ok", "config_hash": c.config_hash(), "sweep": "s", "round": 0, "samples_per_s": sps}
            for c, sps in zip(plan.configs, (10.0, 8.0, 4.0))]
    ipex, zen = extensions.extension_findings(pd.DataFrame(), plan, runs, {"reason": "not an AMD CPU"})
    assert (ipex.kind, ipex.comparison.ratio, ipex.comparison.n) == ("ipex over its torch", 0.5, 1)
    assert (zen.kind, zen.values) == ("zentorch not measured", {"reason": "not an AMD CPU"})
    assert ipex.sentence == "cnn: IPEX over its own stock torch 2.8: 0.50x (screened only, 1 round)."
    assert runtimes.vendor_extension("GenuineIntel", {"available": True}).startswith(
        "Intel CPU: Intel Extension for PyTorch (IPEX), archived")
    with pytest.raises(CpuoptError, match="built for torch 2.14.0"):
        installed(monkeypatch, "2.14.0.1")
        runtimes.import_zentorch()


def test_the_vendor_is_read_from_cpuinfo():
    assert system.parse_cpu_vendor("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n") == "AuthenticAMD"
    assert system.parse_cpu_vendor("processor\t: 0\nCPU part\t: 0xd0c\n") is None


def test_a_zentorch_run_that_cannot_start_is_refused_before_any_process(monkeypatch):
    installed(monkeypatch, None)
    config = RunConfig.for_preset("cnn", "quick", threads=1, compile="zentorch", warmup=1)
    with pytest.raises(CpuoptError, match="--compile zentorch: zentorch is not installed"):
        planning.build_plan(config, planning.Machine.this())
    installed(monkeypatch, "2.13.0.2")
    with pytest.raises(CpuoptError, match="--runtime main"):
        planning.build_plan(config.replace(runtime="ipex"), planning.Machine.this())


def test_notebook_05_compares_zentorch_with_eager_and_inductor_or_says_why_not():
    base = RunConfig(threads=2)
    plan = extensions.configs(base, Facts(physical_cores=2), False, False, ("default",), (), zentorch=True)
    configs = plan.named
    assert configs[extensions.ZENTORCH].compile == "zentorch" and "torch.compile (default)" in configs
    stock, inductor, zen = configs["torch (stock)"], configs["torch.compile (default)"], configs[extensions.ZENTORCH]
    curve = [2.0, 1.5, 1.0]
    results = []
    for i in range(5):
        results += [result(stock, i, 100.0, arm=0, losses=curve), result(inductor, i, 110.0 + i, arm=1, losses=curve),
                    result(zen, i, 120.0 + i, arm=2, losses=[2.0, 1.5, 1.02])]
    for r in results:
        r.update(step_ms={"median": 10.0})
    eager, inductor, drift = extensions.zentorch_findings(extensions.table(results, plan), plan, results, {})
    assert eager.kind == "zentorch over eager" and eager.comparison.faster
    assert eager.comparison.ratio == pytest.approx(1.22, abs=0.005)
    assert (inductor.kind, inductor.values) == ("zentorch over inductor", {"mode": "default"})
    assert inductor.comparison.ratio == pytest.approx(1.09, abs=0.005)
    assert drift.kind == "zentorch loss drift" and drift.values["within"] and drift.values["tolerance"] == 0.10
    failed = [r for r in results if r["config_hash"] != zen.config_hash()] + [
        dict(result(zen, 0, None, arm=2), status="failed", reason="Traceback ...\nRuntimeError: zentorch: unsupported op")]
    failure, = extensions.zentorch_findings(extensions.table(failed, plan), plan, failed, {})
    assert (failure.kind, failure.values) == ("zentorch failed", {"error": "RuntimeError: zentorch: unsupported op"})
    plain = extensions.configs(base, Facts(physical_cores=2), False, False, (), ())
    not_tried = {"reason": "not tried: this CPU is GenuineIntel, and zentorch is AMD's backend"}
    said, = extensions.zentorch_findings(extensions.table([], plain), plain, [], not_tried)
    assert (said.kind, said.values) == ("zentorch not measured", not_tried)
    assert Finding("cnn", "extensions", "zentorch not measured", {"reason": None}).sentence == \
        "cnn: zentorch: not measured here (ZENTORCH = False)."


def test_notebook_05_says_an_installed_zentorch_was_left_out_by_its_parameter():
    from cpuopt_helpers.stages import extensions

    ipex = {"available": False, "reason": "IPEX=0"}
    ready = {"version": "2.13.0", "usable": True, "amd": True, "reason": ""}
    assert extensions.runtimes_measured(ipex, ready, False) == (
        False, ["IPEX runtime skipped: IPEX=0; the torch 2.8 and IPEX rows are left out",
                "zentorch: 2.13.0 installed, not measured here (ZENTORCH = False)"])  # not an empty "zentorch: "
    assert extensions.runtimes_measured(ipex, ready, "auto")[1][-1] == "zentorch: measured: 2.13.0"
    intel = dict(ready, amd=False, reason="not tried: this CPU is GenuineIntel")
    assert extensions.runtimes_measured(ipex, intel, False)[1][-1] == "zentorch: not tried: this CPU is GenuineIntel"
