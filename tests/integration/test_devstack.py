"""`make run` (python -m services.devstack): comes up, serves, and Ctrl-C leaves nothing running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_devstack_starts_serves_and_ctrl_c_stops_everything(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}", TIMESHARE_LOG_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "services.devstack", "--port", "0", "--memory",
                             "--data", str(tmp_path / "data"), "--rate", "10"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"gateway:\s+(http://\S+)", line)
            url = m.group(1) if m else None
        assert url, "".join(lines)
        children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        assert children, "nats-server should run as a child"
        headers = {"Authorization": "Bearer dev-user"}
        deadline = time.monotonic() + 20
        while True:  # the synthetic flow reaches the scheduler
            r = httpx.get(f"{url}/v1/workloads", headers=headers, timeout=5)
            assert r.status_code == 200, r.text
            if r.json()["workloads"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.json()["workloads"], "no synthetic submission arrived"
        assert httpx.get(f"{url}/v1/queue", headers=headers, timeout=5).status_code == 200
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        lines.append(out)
        assert proc.returncode == 0, "".join(lines)
        assert "nothing left running" in out
        assert not [pid for pid in map(int, children) if _alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
