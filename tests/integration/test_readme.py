"""The README's walk-through, as a newcomer runs it: every command in its ``sh`` blocks against a
live stack started as ``make run`` starts it (``python -m services.devstack``, PostgreSQL when
Debian's binaries are there), each one failing the test on a non-zero exit or a traceback.

Left out, and checked to be only these: ``make setup`` (the test runs inside it), ``make run``
(the stack below is what it runs, on a free port and its own data folder) and ``make test``
(this suite). The CLI finds the stack the way the README says, through the env file the stack
writes (``TIMESHARE_DEVSTACK_ENV`` points at this stack's, since its data is not the checkout's
``.run/devstack``), with neither ``TIMESHARE_URL`` nor ``TIMESHARE_TOKEN`` set. What the commands
write under ``out/`` goes to the test's temporary folder instead.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: the README's commands the test does not run (see the module docstring)
NOT_RUN = {"make setup", "make run", "make test"}


def readme_commands(text: str) -> list[str]:
    """The commands of the README's ``sh`` blocks, in order, without their comments."""
    commands: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.splitlines():
            command = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if command:
                commands.append(command)
    return commands


def test_the_readme_is_a_users_document_and_its_commands_are_found():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    commands = readme_commands(text)
    assert {c for c in commands if c.startswith("make ")} == NOT_RUN
    assert len([c for c in commands if not c.startswith("make ")]) >= 20
    # every file the README links to exists
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def _start_stack(data: Path) -> tuple[subprocess.Popen, str, list[str]]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}", TIMESHARE_LOG_LEVEL="WARNING")
    # a busier flow than the demo's default, its durations shorter: preemptions come within a minute
    proc = subprocess.Popen([sys.executable, "-m", "services.devstack", "--port", "0", "--data", str(data),
                             "--load", "2", "--speed", "600"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops everything" in line:
            m = re.search(r"gateway:\s+(http://\S+)", "".join(lines))
            assert m, "".join(lines)
            return proc, m.group(1), lines
    proc.kill()
    raise AssertionError("the devstack did not come up:\n" + "".join(lines))


def _wait_for_preempted_work(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = httpx.get(f"{url}/v1/workloads", params={"preempted": "true", "limit": 1},
                      headers={"Authorization": "Bearer dev-admin"}, timeout=10)
        if r.status_code == 200 and r.json()["workloads"]:
            return
        time.sleep(1)
    raise AssertionError(f"no workload was preempted within {timeout_s}s")


def test_every_command_of_the_readme_runs_against_a_live_stack(tmp_path):
    commands = [c for c in readme_commands((ROOT / "README.md").read_text()) if c not in NOT_RUN]
    cli = ROOT / ".venv" / "bin" / "timeshare"
    if not cli.exists():  # a virtualenv elsewhere: its own CLI
        cli = Path(sys.executable).parent / "timeshare"
    assert cli.exists(), cli
    data = tmp_path / "devstack"
    proc, url, lines = _start_stack(data)
    env = {k: v for k, v in os.environ.items() if k not in ("TIMESHARE_URL", "TIMESHARE_TOKEN")}
    env["TIMESHARE_DEVSTACK_ENV"] = str(data / "env")
    ran: list[str] = []
    try:
        assert (data / "env").read_text().count(url) == 1
        for command in commands:
            shown = command
            command = command.replace(".venv/bin/timeshare", str(cli)).replace(" out/", f" {tmp_path}/out/")
            if "--preempted" in command:
                _wait_for_preempted_work(url)
            assign = re.fullmatch(r"([A-Z_]+)=\$\((.*)\)", command)
            r = subprocess.run(["bash", "-c", assign.group(2) if assign else command], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=300)
            said = f"$ {shown}\n{r.stdout}{r.stderr}"
            ran.append(said)
            assert r.returncode == 0, said
            assert "Traceback" not in r.stdout + r.stderr, said
            if assign:
                env[assign.group(1)] = r.stdout.strip()
                assert env[assign.group(1)] and "\n" not in env[assign.group(1)], said
            if str(cli) in command and "TIMESHARE_TOKEN=" not in command and "simulate" not in command \
                    and " check " not in command:
                # the stack it talks to, found in the env file: said on stderr, once
                assert r.stderr.count(f"the devstack at {url}") == 1, said
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
    assert proc.returncode == 0, "".join(lines) + out
    # what each command printed, for whoever reads the test's output (pytest -s)
    print("\n".join(ran))
