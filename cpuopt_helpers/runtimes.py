"""Python runtimes a worker can run under: this one, the IPEX venv, or any interpreter.

Intel Extension for PyTorch (IPEX) is archived: its last CPU release, 2.8.0, needs
torch 2.8.x, while the workbook's own environment has a newer torch. So IPEX lives in a
second venv, ``.venv-ipex`` (built by ``make ipex`` from requirements-ipex.txt), and a
worker started with that interpreter imports it there.

IPEX checks the torch it is loaded into and calls ``os._exit`` on a mismatch, which
would kill a notebook kernel or a worker without a word. ``import_ipex`` therefore
compares the installed versions first (from package metadata, without importing IPEX)
and raises a clear error instead.

Imports only the standard library (and the stdlib-only ``config``) at module level: the probe
(``python -m cpuopt_helpers.runtimes``) runs under the other interpreter. ``run_json_module`` is
the one way a process other than the training worker starts, in this interpreter or another.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from cpuopt_helpers.config import USER_WINS
from cpuopt_helpers.errors import CpuoptError

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RUNTIMES = ("main", "ipex")
SKIP_ENV = "IPEX"  # IPEX=0: the IPEX runtime is not built, and what needs it is skipped


def ipex_venv() -> Path:
    return Path(os.environ.get("CPUOPT_IPEX_VENV", PROJECT_ROOT / ".venv-ipex"))


def ipex_status() -> dict:
    """Whether the IPEX runtime is there; if not, why (for skips and notebook notes)."""
    python = ipex_venv() / "bin" / "python"
    if python.exists():
        return {"available": True, "python": str(python), "reason": ""}
    if os.environ.get(SKIP_ENV) == "0":
        why = f"IPEX=0 was set, so {ipex_venv()} was not built; run `make ipex` to build it"
    else:
        why = f"the IPEX runtime {ipex_venv()} is not built; run `make ipex` (about 4 GB of downloads)"
    return {"available": False, "python": str(python), "reason": why}


def resolve_python(runtime: str) -> str:
    """The interpreter for a runtime name (main, ipex) or a path to a python."""
    if runtime == "main":
        return sys.executable
    if runtime == "ipex":
        status = ipex_status()
        if not status["available"]:
            raise CpuoptError(status["reason"])
        return status["python"]
    path = Path(runtime)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise CpuoptError(f"runtime {runtime!r} is neither main, ipex nor an executable python; "
                          "give --runtime main, --runtime ipex or the path of a python interpreter")
    return str(path)


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2])


def ipex_mismatch(torch_version: str, ipex_version: str) -> str | None:
    """Why IPEX would refuse this torch (it needs the same major.minor), or None."""
    if _major_minor(torch_version) == _major_minor(ipex_version):
        return None
    want = ".".join(map(str, _major_minor(ipex_version)))
    return (f"intel-extension-for-pytorch {ipex_version} needs torch {want}.x but this interpreter has torch "
            f"{torch_version}; run IPEX in its own runtime (--runtime ipex, built by `make ipex`)")


def installed_versions() -> dict:
    """torch and IPEX versions of this interpreter, read from package metadata (nothing imported)."""
    from importlib import metadata

    out = {}
    for name, dist in (("torch", "torch"), ("ipex", "intel-extension-for-pytorch")):
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def zentorch_mismatch(torch_version: str, zentorch_version: str) -> str | None:
    """Why this zentorch does not fit this torch (each release is built for one torch release,
    zentorch 2.13.0.x for torch 2.13.0), or None."""
    release = lambda v: tuple(v.split("+")[0].split(".")[:3])  # noqa: E731
    if release(torch_version) == release(zentorch_version):
        return None
    want = ".".join(release(torch_version))
    return (f"zentorch {zentorch_version} is built for torch {'.'.join(release(zentorch_version))} but this "
            f"interpreter has torch {torch_version}: pip install 'zentorch=={want}.*'")


def zentorch_status(vendor: str | None = None) -> dict:
    """Whether AMD's torch.compile backend can run here (read from package metadata, nothing
    imported); ``reason`` says why not, or, on a CPU not AMD's, that it was not tried."""
    from importlib import metadata

    try:
        version = metadata.version("zentorch")
    except metadata.PackageNotFoundError:
        version = None
    torch_version = installed_versions()["torch"] or "?"
    out = {"version": version, "usable": False, "amd": vendor == "AuthenticAMD", "reason": ""}
    if version is None:
        release = ".".join(torch_version.split("+")[0].split(".")[:3])
        out["reason"] = (f"zentorch is not installed; AMD's torch.compile backend: pip install 'zentorch=={release}.*' "
                         "(make setup installs it on an AMD CPU)")
    else:
        out["reason"] = zentorch_mismatch(torch_version, version) or ""
        out["usable"] = not out["reason"]
    if vendor is not None and not out["amd"]:
        out["reason"] = (f"not tried: this CPU is {vendor}, and zentorch is AMD's backend (over ZenDNN), validated on "
                         "AMD EPYC only" + (f"; zentorch {version} is installed: `cpuopt bench --compile zentorch` "
                                            "runs it anyway" if out["usable"] else ""))
    return out


def vendor_extension(vendor: str | None, ipex: dict | None = None, measured: dict | None = None) -> str:
    """The CPU vendor's extension for PyTorch that applies here, its state, and what notebook 05
    last measured of it on this machine (``measured``: its stored findings) (`cpuopt doctor`)."""
    mine = [line for line in (measured or {}).get("lines", [])
            if ("zentorch" in line) == (vendor == "AuthenticAMD")]  # the extension of this CPU's vendor
    if mine:
        found = (f"; measured here by notebook 05 ({measured.get('preset')} preset, {measured.get('date')}): "
                 + " ".join(mine))
    else:
        found = ("; not measured on this machine yet (notebook 05, "
                 + ("`make run PRESET=full`)" if vendor == "AuthenticAMD" else "`make run`)"))  # standard: no zentorch
    if vendor == "AuthenticAMD":
        z = zentorch_status(vendor)
        state = f"zentorch {z['version']} installed, fits this torch" if z["usable"] else z["reason"]
        return (f"AMD CPU: zentorch, AMD's torch.compile backend over ZenDNN (`--compile zentorch`; notebook 05 "
                f"measures it for training beside Inductor and IPEX): {state}{found}")
    if vendor == "GenuineIntel":
        state = "its runtime is built" if (ipex or {}).get("available") else (ipex or {}).get("reason", "")
        return ("Intel CPU: Intel Extension for PyTorch (IPEX), archived by Intel, last release 2.8.0 for torch 2.8 "
                f"(`--runtime ipex`; notebook 05 measures it in its own runtime): {state}{found}")
    return f"no vendor extension for this CPU ({vendor or 'vendor unknown'}): stock PyTorch and torch.compile"


def import_zentorch():
    """Import zentorch (which registers the backend) after checking it fits this torch."""
    status = zentorch_status()
    if not status["usable"]:
        raise CpuoptError(status["reason"])
    import zentorch

    return zentorch


def import_ipex():
    """Import IPEX after checking it matches this torch; a clear error instead of os._exit."""
    versions = installed_versions()
    if versions["ipex"] is None:
        raise CpuoptError(f"intel-extension-for-pytorch is not installed in {sys.executable}; "
                          "use --runtime ipex (built by `make ipex`)")
    why = ipex_mismatch(versions["torch"], versions["ipex"])
    if why:
        raise CpuoptError(why)
    import intel_extension_for_pytorch as ipex

    return ipex


def probe_here() -> dict:
    """Facts of the running interpreter: versions, and the ISA levels IPEX sees."""
    versions = installed_versions()
    facts = {"python": sys.executable, "python_version": sys.version.split()[0], **versions,
             "ipex_usable": False, "ipex_isa": None, "reason": ""}
    if versions["ipex"] is None:
        facts["reason"] = "intel-extension-for-pytorch is not installed here"
        return facts
    why = ipex_mismatch(versions["torch"], versions["ipex"])
    if why:
        facts["reason"] = why
        return facts
    ipex = import_ipex()
    facts["ipex_usable"] = True
    try:
        facts["ipex_isa"] = {"current": str(ipex._C._get_current_isa_level()),
                             "highest": str(ipex._C._get_highest_cpu_support_isa_level())}
    except AttributeError:  # private API; report versions only
        pass
    return facts


def probe_cache_key(python: str) -> str | None:
    """What a probe's answer depends on: the interpreter, what is installed in it (its site-packages
    folders' modification times: an install or removal changes them), the path it runs with (IPEX
    imports a transformers it finds there; a package added later to a folder already on that path
    is not seen: delete ~/.cache/cpuopt) and the CPU (the ISA levels). None where the interpreter has
    no site-packages of its own to watch: such a probe is not cached."""
    sites = sorted(Path(python).parent.parent.glob("lib/python*/site-packages"))
    if not sites:
        return None
    try:
        flags = sorted({line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")})
        parts = [python, os.path.realpath(python), python_path(dict(os.environ)), *flags,
                 *(f"{s}:{s.stat().st_mtime_ns}" for s in sites)]
    except OSError:
        return None
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


@lru_cache(maxsize=None)
def probe(python: str) -> dict:
    """Run probe_here() under another interpreter. The answer is cached per interpreter, its installed
    packages, path and CPU (``probe_cache_key``; starting torch 2.8 and IPEX takes 10-20 s of every
    notebook and command that asks otherwise); a probe that did not finish is not cached. A runtime
    that cannot even be probed (IPEX 2.8 importing a newer transformers it finds on PYTHONPATH, say)
    is reported unusable with the reason, so that what needs it is skipped and the rest goes on."""
    from cpuopt_helpers import system

    key, path = probe_cache_key(python), system.user_cache_file("runtime_probes.json")
    cached = system.read_cache(path).get(key) if key else None
    if isinstance(cached, dict):
        return cached
    what = f"probing the runtime {python}"
    try:
        facts = run_json_module("cpuopt_helpers.runtimes", [], what, python=python, timeout_s=180, error=CpuoptError)
    except CpuoptError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        last = (lines[-1] if lines else str(exc)).replace(what, "it")
        return {"python": python, "torch": None, "ipex": None, "ipex_usable": False, "ipex_isa": None,
                "reason": f"{what} failed: {last}"}
    if key:
        system.keep_in_cache(path, key, facts)
    return facts


def ipex_facts() -> dict:
    """What `cpuopt doctor` reports about the IPEX runtime."""
    status = ipex_status()
    if not status["available"]:
        return {"available": False, "path": str(ipex_venv()), "reason": status["reason"]}
    facts = probe(status["python"])
    return {"available": facts["ipex_usable"], "path": str(ipex_venv()), **facts}


def python_path(base_env: dict) -> str:
    """The current folder (user workloads), then cpuopt_helpers' own root (other runtimes), then the user's."""
    paths = [os.getcwd(), str(PROJECT_ROOT)] + base_env.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join(dict.fromkeys(p for p in paths if p))


def run_json_module(module: str, args: list[str], what: str, *, threads: int | None = None,
                    cores: list[int] | None = None, python: str | None = None, timeout_s: float = 600,
                    error: type[Exception] = RuntimeError) -> object:
    """Run `python -m module args` in a fresh process; return its last stdout line as JSON.

    The one way a process other than the training worker starts (ceilings, replays,
    accuracy, kernel benchmarks, probes of another runtime): ``threads`` fixes its OpenMP
    and MKL threads before it starts, ``cores`` hands it the cores to pin itself to
    (CPUOPT_CORES), ``python`` runs another interpreter with this project importable. As
    for workers, a value of yours among USER_WINS wins over the plan, with a warning.
    """
    planned = {}
    if threads:
        planned.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if cores:
        planned["CPUOPT_CORES"] = ",".join(map(str, cores))
    env = dict(os.environ, PYTHONPATH=python_path(os.environ))
    for key, value in planned.items():
        if key in USER_WINS and env.get(key, value) != value:
            log.warning("%s=%s from your environment overrides the planned %s for the %s; unset it to let cpuopt "
                        "choose", key, env[key], value, what)
        else:
            env[key] = value
    try:
        proc = subprocess.run([python or sys.executable, "-m", module, *args], env=env, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise error(f"{what} did not finish in {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise error(f"{what} failed (exit code {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-1500:]}")
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise error(f"{what} printed no result: {(proc.stderr or proc.stdout).strip()[-1500:]}") from None


if __name__ == "__main__":
    print(json.dumps(probe_here()))
