"""The theoretical peak: FLOP a cycle a core from a table with sources, times the clock and the cores."""

import pytest

from cpuopt_helpers import peak
from tests.conftest import FIXTURES


def cpuinfo(vendor: str, family: int, model: int, mhz: float | None = 2000.0, flags: str = "fpu avx2 fma") -> str:
    lines = [f"vendor_id\t: {vendor}", f"cpu family\t: {family}", f"model\t\t: {model}", f"flags\t\t: {flags}"]
    return "\n".join(lines + ([f"cpu MHz\t\t: {mhz:.3f}"] if mhz else [])) + "\n"


def test_sapphire_rapids_amx_peak_is_about_4_tflops_on_two_cores_at_2_ghz(tmp_path):
    t = peak.theoretical(cpuinfo(peak.INTEL, 6, 143, flags="avx512f amx_bf16 amx_tile"), 2, root=str(tmp_path))
    assert t["core"] == "Intel Sapphire Rapids" and "Optimization Reference Manual" in t["source"]
    assert t["theoretical_gflops"] == {"fp32": pytest.approx(256.0), "bf16": pytest.approx(4096.0)}
    assert t["clock_ghz"] == 2.0 and t["clock_source"].startswith("/proc/cpuinfo cpu MHz")


def test_zen4_runs_avx512_at_half_a_sapphire_rapids_cores_fp32_rate(tmp_path):
    zen4 = peak.theoretical(cpuinfo(peak.AMD, 25, 17), 2, root=str(tmp_path))
    spr = peak.theoretical(cpuinfo(peak.INTEL, 6, 143), 2, root=str(tmp_path))
    assert zen4["core"] == "AMD Zen 4" and zen4["theoretical_gflops"]["fp32"] * 2 == spr["theoretical_gflops"]["fp32"]
    assert zen4["flop_per_cycle_per_core"]["bf16"] == 64
    milan = peak.theoretical(cpuinfo(peak.AMD, 25, 1), 2, root=str(tmp_path))  # Zen 3: no bf16 arithmetic
    assert milan["core"] == "AMD Zen 3" and milan["theoretical_gflops"]["bf16"] is None


def test_cooper_lake_is_read_from_its_flags_and_the_sysfs_maximum_clock_wins(tmp_path):
    freq = tmp_path / "sys/devices/system/cpu/cpu0/cpufreq"
    freq.mkdir(parents=True)
    (freq / "cpuinfo_max_freq").write_text("3500000\n")
    text = (FIXTURES / "cpuinfo_cooperlake.txt").read_text()
    t = peak.theoretical(text, 4, root=str(tmp_path))
    assert t["flop_per_cycle_per_core"] == {"fp32": 64, "bf16": 128} and t["clock_ghz"] == 3.5
    assert t["theoretical_gflops"]["fp32"] == pytest.approx(64 * 3.5 * 4) and "highest clock" in t["clock_source"]


def test_where_sysfs_shows_no_maximum_the_clock_is_measured_and_said_so(tmp_path):
    text = cpuinfo(peak.AMD, 25, 1, mhz=2445.4)
    ghz, source = peak.clock_ghz(text, str(tmp_path), measure=lambda: 3.1)
    assert ghz == 3.1 and source.startswith("measured here")
    ghz, source = peak.clock_ghz(text, str(tmp_path), measure=lambda: None)  # no compiler: cpuinfo's, and why
    assert ghz == pytest.approx(2.4454) and "could not be measured here" in source
    freq = tmp_path / "sys/devices/system/cpu/cpu0/cpufreq"
    freq.mkdir(parents=True)
    (freq / "cpuinfo_max_freq").write_text("3500000\n")
    assert peak.clock_ghz(text, str(tmp_path), measure=lambda: 1 / 0)[0] == 3.5  # sysfs's maximum: nothing measured


def test_the_clock_measured_here_is_a_clock():
    """Dependent adds, one a cycle: a loop the compiler dropped or a chain that ran in parallel
    would give far more than any CPU's clock."""
    import platform
    import shutil

    if platform.machine() not in peak.ADDS or not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler or no adds for this instruction set: the clock is not measured here")
    peak.measured_clock_ghz.cache_clear()
    assert 0.8 < peak.measured_clock_ghz() < 6.5


def test_a_cpu_not_in_the_table_is_unknown_never_guessed(tmp_path):
    for text in ((FIXTURES / "cpuinfo_graviton3.txt").read_text(), cpuinfo(peak.INTEL, 6, 1)):
        t = peak.theoretical(text, 2, root=str(tmp_path))
        assert t["core"].startswith("unknown") and t["theoretical_gflops"] == {"fp32": None, "bf16": None}
    no_clock = peak.theoretical(cpuinfo(peak.AMD, 25, 17, mhz=None), 2, root=str(tmp_path))
    assert no_clock["theoretical_gflops"]["fp32"] is None and no_clock["clock_source"].startswith("unknown")


def test_the_report_gives_both_the_theoretical_and_the_measured_peak_and_its_share(tmp_path):
    report = peak.peak_report(cpuinfo(peak.INTEL, 6, 143), 2, {"gemm_gflops_best": 128.0, "gemm_gflops_bf16_best": 796.0},
                              root=str(tmp_path))
    assert report["fp32"] == {"theoretical_gflops": pytest.approx(256.0), "measured_gflops": 128.0,
                              "measured_share": pytest.approx(0.5), "measured_paths": None}
    assert report["bf16"]["measured_share"] == pytest.approx(796 / 4096)
    fp32, bf16, clock = peak.peak_lines(report)
    assert clock == "clock        2.00 GHz: " + report["clock_source"] and "cpu MHz" in clock
    assert fp32.startswith("peak fp32") and "256 GFLOP/s theoretical (64 FLOP/cycle/core x 2.00 GHz x 2 cores)" in fp32
    assert "measured GEMM 128 GFLOP/s = 50% of it" in fp32
    paths = {"gemm_gflops_best": 128.0, "gemm_paths": {"mm 1024": 100.0, "mm 2048": 120.0, "conv1x1 2048": 128.0}}
    assert "measured GEMM 128 GFLOP/s (best of mm 1024, mm 2048, conv1x1 2048)" in peak.peak_lines(
        peak.peak_report(cpuinfo(peak.INTEL, 6, 143), 2, paths, root=str(tmp_path)))[0]
    unmeasured = peak.peak_lines(peak.peak_report(cpuinfo(peak.AMD, 25, 1), 2, None, root=str(tmp_path)))
    assert "measured: not yet (notebook 00)" in unmeasured[0] and "no arithmetic of this dtype" in unmeasured[1]


def test_the_measured_ceiling_is_the_best_over_sizes_and_paths():
    from cpuopt_helpers import roofline

    measured = roofline.measure_here(128, 1 << 20, 2)
    assert set(measured["gemm_paths"]) == {"mm 64", "mm 128", "conv1x1 128"}  # two sizes, two paths
    assert all(rate > 0 for rate in measured["gemm_paths"].values())
    assert measured["write_gbs"] > 0 and measured["fresh_write_gbs"] > 0  # the two write rates (notebook 00)


def test_every_reader_of_stored_ceilings_takes_the_peak_at_the_clock_read_with_them(tmp_path, monkeypatch):
    """A clock measured in a VM moves a few percent between readings: notebook 01, 02, 09 and the
    page of one run state one theoretical peak, the one at the clock stored with the ceilings."""
    monkeypatch.setattr(peak, "measured_clock_ghz", lambda: 1 / 0)  # nothing is measured again
    stored = {"gemm_gflops_best": 128.0, "clock_ghz": 3.2, "clock_source": "measured here: dependent adds"}
    report = peak.peak_report(cpuinfo(peak.AMD, 25, 17), 2, stored)  # root "/": would measure, without the clock
    assert report["clock_ghz"] == 3.2 and report["fp32"]["theoretical_gflops"] == pytest.approx(32 * 3.2 * 2)
    assert report["clock_source"] == "measured here: dependent adds, with the GEMM ceilings"
    older = peak.peak_report(cpuinfo(peak.AMD, 25, 17, mhz=2400.0), 2, {"gemm_gflops_best": 128.0}, root=str(tmp_path))
    assert older["clock_ghz"] == 2.4  # ceilings from an older cpuopt carry no clock: read now
