"""The IPEX runtime: a real IPEX training step, the version-mismatch path, the skip path.

Whatever starts an interpreter (the command, a worker, the IPEX runtime's probe) is slow; the
version rules and the skip path's messages are checked in-process.
"""

import json
import os
import subprocess
import sys

import pytest

from cpuopt_helpers import cli as cpuopt_cli
from cpuopt_helpers import runtimes
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.errors import CpuoptError

STATUS = runtimes.ipex_status()
needs_ipex = pytest.mark.skipif(os.environ.get("IPEX") == "0" and not STATUS["available"],
                                reason=f"skipped: {STATUS['reason']}")


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "cpuopt_helpers.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.fixture
def mismatched_ipex(tmp_path):
    """An IPEX 2.8 install seen by torch 2.13: its import exits the process, as the real one does."""
    pkg = tmp_path / "intel_extension_for_pytorch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import os\nos._exit(17)  # what IPEX's version check does\n")
    dist = tmp_path / "intel_extension_for_pytorch-2.8.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: intel-extension-for-pytorch\nVersion: 2.8.0\n")
    return dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


@pytest.mark.parametrize("torch_version, ipex_version, ok", [
    ("2.8.0+cpu", "2.8.0+cpu", True), ("2.8.1", "2.8.0", True), ("2.13.0+cpu", "2.8.0", False),
    ("2.7.1", "2.8.0", False)])
def test_ipex_needs_the_same_torch_major_minor(torch_version, ipex_version, ok):
    why = runtimes.ipex_mismatch(torch_version, ipex_version)
    assert (why is None) == ok
    if not ok:
        assert "needs torch 2.8.x" in why and "--runtime ipex" in why


@pytest.mark.slow
def test_a_mismatched_ipex_is_a_clear_error_not_a_dead_process(mismatched_ipex):
    proc = cli("bench", "--ipex", "--runtime", sys.executable, env=mismatched_ipex)
    assert proc.returncode == 2, proc.stderr
    assert "needs torch 2.8.x but this interpreter has torch 2.13" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_worker_checks_versions_before_importing_ipex(mismatched_ipex):
    config = RunConfig(ipex=True, runtime=sys.executable, steps=1, warmup=0).to_json()
    proc = subprocess.run([sys.executable, "-m", "cpuopt_helpers.worker", "--config", config],
                          capture_output=True, text=True, env=mismatched_ipex, timeout=300)
    assert proc.returncode == 2 and "needs torch 2.8.x" in proc.stderr  # not IPEX's exit code 17


def test_skip_path_says_what_was_skipped_and_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IPEX", "0")
    monkeypatch.setenv("CPUOPT_IPEX_VENV", str(tmp_path / "none"))
    assert cpuopt_cli.main(["bench", "--ipex", "--runtime", "ipex"]) == 2
    err = capsys.readouterr().err
    assert "IPEX=0 was set" in err and "make ipex" in err and len(err.strip().splitlines()) == 1
    facts = runtimes.ipex_facts()  # what doctor reports as its ipex_runtime
    assert facts["available"] is False and "IPEX=0" in facts["reason"]


@pytest.mark.slow
def test_doctor_command_says_the_ipex_runtime_was_skipped(tmp_path):
    env = dict(os.environ, IPEX="0", CPUOPT_IPEX_VENV=str(tmp_path / "none"))
    proc = cli("bench", "--ipex", "--runtime", "ipex", env=env)
    assert proc.returncode == 2 and "IPEX=0 was set" in proc.stderr and "make ipex" in proc.stderr
    doctor = json.loads(cli("doctor", "--json", env=env).stdout)
    assert doctor["ipex_runtime"]["available"] is False and "IPEX=0" in doctor["ipex_runtime"]["reason"]


def test_ipex_without_its_runtime_is_refused():
    with pytest.raises(CpuoptError, match="--runtime ipex"):
        from cpuopt_helpers.config import validate

        validate(RunConfig(ipex=True), 2, 2)


def test_unknown_runtime_is_refused():
    with pytest.raises(CpuoptError, match="neither main, ipex nor an executable python"):
        runtimes.resolve_python("/no/such/python")


@pytest.mark.parametrize("script, why", [
    ("#!/bin/sh\necho hello\n", "it printed no result: hello"),
    (f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n", "torch is not installed there"),
])
def test_a_runtime_without_torch_is_refused_before_any_worker_starts(tmp_path, script, why):
    """A python of yours with no torch in it: one line saying so, exit 2, not a worker's traceback."""
    fake = tmp_path / "python"
    fake.write_text(script)
    fake.chmod(0o755)
    proc = cli("bench", "--workload", "cnn", "--preset", "quick", "--runtime", str(fake))
    assert proc.returncode == 2 and why in proc.stderr and "--runtime main" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@needs_ipex
def test_doctor_reports_the_ipex_runtime():
    facts = runtimes.ipex_facts()
    assert facts["available"] and facts["ipex"].startswith("2.8") and facts["torch"].startswith("2.8")
    assert facts["ipex_isa"]["current"]  # the ISA level IPEX dispatches to on this CPU


def test_a_runtime_that_cannot_be_probed_is_unusable_with_its_reason_not_an_error(tmp_path, monkeypatch):
    """IPEX 2.8 importing a transformers 5.x it finds on PYTHONPATH dies at import: the runtime is
    reported unusable with that line, so notebooks skip what needs it and go on."""
    from cpuopt_helpers import runtimes

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"NameError: name 'MoeModelOutputWithPast' is not defined\" >&2\nexit 1\n")
    fake.chmod(0o755)
    probed = runtimes.probe(str(fake))
    assert probed["ipex_usable"] is False and "MoeModelOutputWithPast" in probed["reason"]
    monkeypatch.setattr(runtimes, "ipex_status", lambda: {"available": True, "python": str(fake), "reason": ""})
    facts = runtimes.ipex_facts()
    assert facts["available"] is False and facts["reason"].startswith(f"probing the runtime {fake} failed")


def test_a_runtime_probe_is_cached_per_interpreter_and_what_is_installed_in_it(tmp_path, monkeypatch):
    """Starting torch 2.8 and IPEX to ask what they are costs 10-20 s a process: the answer is kept in
    the user's cache, and asked again once a package is installed or removed there; a failed probe
    is not kept."""
    from cpuopt_helpers import runtimes

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / "venv" / "bin").mkdir()
    python, calls = tmp_path / "venv" / "bin" / "python", tmp_path / "calls"
    python.write_text(f"#!/bin/sh\necho probed >> {calls}\n"
                      "echo '{\"torch\": \"2.8.0\", \"ipex\": \"2.8.0\", \"ipex_usable\": true, \"reason\": \"\"}'\n")
    python.chmod(0o755)

    def probed() -> tuple[dict, int]:
        runtimes.probe.cache_clear()  # as a new process would
        facts = runtimes.probe(str(python))
        return facts, len(calls.read_text().splitlines())

    assert probed() == ({"torch": "2.8.0", "ipex": "2.8.0", "ipex_usable": True, "reason": ""}, 1)
    assert probed()[1] == 1  # from the cache: no process started
    (site / "transformers").mkdir()  # something installed there: asked again
    assert probed()[1] == 2 and probed()[1] == 2
    python.write_text(f"#!/bin/sh\necho probed >> {calls}\nexit 1\n")
    (site / "transformers").rmdir()
    assert probed()[0]["ipex_usable"] is False and probed()[1] == 4  # a failed probe: asked every time
    runtimes.probe.cache_clear()
