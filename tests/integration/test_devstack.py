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


def _start_devstack(data: str) -> tuple[subprocess.Popen, list[str], str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}", TIMESHARE_LOG_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "services.devstack", "--port", "0", "--data", data, "--rate", "5"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"gateway:\s+(http://\S+)", line)
        if m:
            return proc, lines, m.group(1)
    proc.kill()
    raise AssertionError("devstack did not come up:\n" + "".join(lines))


def _pid_after(lines: list[str], what: str) -> int:
    for line in lines:
        m = re.search(rf"{what} ready .*\(pid (\d+)", line)
        if m:
            return int(m.group(1))
    raise AssertionError(f"no '{what} ready (pid N)' line in:\n" + "".join(lines))


def _gone(pid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_devstack_killed_takes_its_servers_with_it_and_the_next_start_says_what_it_found():
    import shutil
    import tempfile

    from services.devstack.servers import NatsServer, postgres_bin_dir

    if postgres_bin_dir() is None:
        pytest.fail("PostgreSQL server binaries not found: apt-get install postgresql (initdb, pg_ctl)")
    data = tempfile.mkdtemp(prefix="timeshare-devstack-")
    os.chmod(data, 0o755)  # the postgres user enters it
    stray = None
    try:
        proc, lines, url = _start_devstack(data)
        try:
            text = "".join(lines)
            for step in ("starting nats-server", "starting PostgreSQL", "starting placement", "gateway ready"):
                assert step in text, text  # it says what it is doing while it starts
            nats_pid, pg_pid = _pid_after(lines, "nats-server"), _pid_after(lines, "PostgreSQL")
            headers = {"Authorization": "Bearer dev-user"}
            r = httpx.get(f"{url}/v1/workloads", headers=headers, timeout=5)
            assert r.status_code == 200
        finally:
            proc.kill()  # SIGKILL: no handler runs, no cleanup
            proc.wait()
        assert _gone(nats_pid), "nats-server outlived the devstack"
        assert _gone(pg_pid), "PostgreSQL outlived the devstack"
        # a nats-server left running on the store (as an older devstack would leave it)
        stray = NatsServer(os.path.join(data, "nats")).start()
        proc, lines, url = _start_devstack(data)
        try:
            text = "".join(lines)
            assert "did not stop cleanly" in text, text
            assert f"nats-server (pid {stray.proc.pid}) was left running" in text, text
            assert _gone(stray.proc.pid), "the stray nats-server was not stopped"
            r = httpx.get(f"{url}/v1/workloads", headers={"Authorization": "Bearer dev-user"}, timeout=5)
            assert r.status_code == 200
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0 and "nothing left running" in out, out
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert _gone(_pid_after(lines, "nats-server")) and _gone(_pid_after(lines, "PostgreSQL"))
        assert not os.path.exists(os.path.join(data, "devstack.pid"))
    finally:
        if stray is not None:
            stray.stop()
        shutil.rmtree(data, ignore_errors=True)


def test_a_nats_server_stopped_cleanly_leaves_nothing_the_next_start_complains_about(tmp_path):
    from services.devstack.servers import NatsServer

    first = NatsServer(str(tmp_path / "nats")).start()
    first.stop()
    again = NatsServer(str(tmp_path / "nats")).start()
    try:
        assert again.notes == []
    finally:
        again.proc.kill()  # killed: its pid file stays, and the next start says so
        again.proc.wait()
    third = NatsServer(str(tmp_path / "nats")).start()
    third.stop()
    assert third.notes == [f"{tmp_path / 'nats'}: the last nats-server did not stop cleanly (stale pid file)"]


def test_after_a_clean_ctrl_c_the_next_start_keeps_the_port_and_reports_nothing_left(tmp_path):
    from services.devstack.servers import free_port

    data = tmp_path / "data"
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}", TIMESHARE_LOG_LEVEL="WARNING")
    port = free_port()
    urls, outputs = [], []
    for argv in (["--port", str(port)], []):  # the second start is told no port: it takes the last one
        proc = subprocess.Popen([sys.executable, "-m", "services.devstack", "--memory", "--data", str(data),
                                 "--rate", "2", *argv],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            lines: list[str] = []
            while not any("Ctrl-C stops everything" in line for line in lines):
                line = proc.stdout.readline()
                assert line, "".join(lines)
                lines.append(line)
            text = "".join(lines)
            urls.append(re.search(r"gateway:\s+(http://\S+)", text).group(1))
            # the banner: how to reach it from the CLI, and the env file it wrote for the CLI
            assert f"export TIMESHARE_URL={urls[-1]} TIMESHARE_TOKEN=dev-admin" in text, text
            assert (data / "env").read_text().splitlines()[1:] == [f"export TIMESHARE_URL={urls[-1]}",
                                                                  "export TIMESHARE_TOKEN=dev-admin"]
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
            outputs.append(text + out)
            assert proc.returncode == 0 and "nothing left running" in out, out
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert urls == [f"http://127.0.0.1:{port}"] * 2
    assert "did not stop cleanly" not in outputs[1] and "was left running" not in outputs[1], outputs[1]
