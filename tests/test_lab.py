"""JupyterLab starts headless, lists the notebooks and the `cpuopt` kernel, and stops."""

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TOKEN = "cpuopt-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    req = urllib.request.Request(url, headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def test_jupyterlab_lists_notebooks_and_kernel(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={TOKEN}", "--allow-root", f"--ServerApp.root_dir={ROOT / 'notebooks'}", "--ServerApp.port_retries=0"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "lab.log", "w"), cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                contents = get(f"{base}/api/contents")
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "lab.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "JupyterLab did not answer within 90 s"
                time.sleep(0.5)
        names = {item["name"] for item in contents["content"]}
        expected = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
        assert expected and expected <= names
        specs = get(f"{base}/api/kernelspecs")["kernelspecs"]
        assert "cpuopt" in specs
        with urllib.request.urlopen(f"{base}/lab?token={TOKEN}", timeout=5) as resp:
            assert resp.status == 200 and b"JupyterLab" in resp.read()
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.poll() is not None
