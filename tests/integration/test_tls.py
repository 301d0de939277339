"""TLS on both hops: the services reach NATS over TLS (with their NATS users), the gateway serves
HTTPS; a client that does not speak TLS, or does not trust the certificate, gets nothing."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

import httpx
import nats
import pytest

from services.devstack.servers import NatsServer, free_port
from services.devstack.stack import Stack

pytestmark = pytest.mark.integration


def _certs(d: Path) -> dict[str, str]:
    """A throwaway CA and a certificate for 127.0.0.1 / localhost it signed (openssl CLI)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl not found (apt-get install openssl)")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
        "-subj", "/CN=timeshare test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "1", "-extfile", "ext")
    return {k: str(d / f) for k, f in (("ca", "ca.pem"), ("cert", "server.pem"), ("key", "server.key"))}


async def test_services_talk_to_nats_over_tls_and_the_gateway_serves_https(make_settings):
    work = Path(tempfile.mkdtemp(prefix="timeshare-tls-"))
    certs = _certs(work)
    server = NatsServer(str(work / "nats"), extra_conf=(
        f'tls {{ cert_file: "{certs["cert"]}", key_file: "{certs["key"]}" }}')).start()
    try:
        settings = make_settings(nats_url=f"tls://127.0.0.1:{server.port}", nats_credentials=server.credentials_file,
                                 nats_tls_ca=certs["ca"], http_tls_cert=certs["cert"], http_tls_key=certs["key"],
                                 http_port=free_port())
        stack = await Stack(settings).start()
        try:
            url = stack["gateway"].url
            assert url.startswith("https://")
            async with httpx.AsyncClient(base_url=url, verify=ssl.create_default_context(cafile=certs["ca"]),
                                         headers={"Authorization": "Bearer tok-carol"}) as http:
                r = await http.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 1,
                                                           "work_s": 1})
                assert r.status_code == 202, r.text
                assert (await http.get("/healthz")).status_code == 200
            # a client that does not trust the CA, or speaks plain HTTP, gets no answer
            async with httpx.AsyncClient(base_url=url) as untrusting:
                with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await untrusting.get("/healthz")
            async with httpx.AsyncClient(base_url=url.replace("https://", "http://")) as plain:
                with pytest.raises(httpx.HTTPError):
                    r = await plain.get("/healthz")
                    r.raise_for_status()
            # NATS: a client that does not trust the CA gets nothing, even with the right password
            creds = json.loads(Path(server.credentials_file).read_text())
            errors: list[str] = []

            async def on_error(exc):
                errors.append(str(exc))

            with pytest.raises(Exception):
                await nats.connect(f"nats://127.0.0.1:{server.port}", user="operator", password=creds["operator"],
                                   allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2,
                                   error_cb=on_error)
            assert any("CERTIFICATE_VERIFY_FAILED" in e for e in errors), errors
            # ... and one that speaks plain text is not answered: the server requires TLS
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            info = json.loads((await reader.readline()).decode().split(" ", 1)[1])
            assert info["tls_required"] is True
            writer.write(("CONNECT " + json.dumps({"user": "operator", "pass": creds["operator"]})
                          + "\r\nPING\r\n").encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(200), 5)
            assert b"PONG" not in answer
            writer.close()
        finally:
            await stack.stop()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


async def test_a_nats_server_that_verifies_clients_admits_only_a_certificate_it_signed(tmp_path):
    """Mutual TLS: ``verify: true`` on the server; a service with TIMESHARE_NATS_TLS_CERT/_KEY
    connects (as its NATS user), the same password without a client certificate does not."""
    from services.common.bus import Bus
    from services.common.settings import Settings

    work = Path(tempfile.mkdtemp(prefix="timeshare-mtls-"))
    certs = _certs(work)
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr",
                    "-subj", "/CN=timeshare-gateway"], cwd=work, check=True, capture_output=True)
    (work / "client-ext").write_text("extendedKeyUsage=clientAuth\n")
    subprocess.run(["openssl", "x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-out", "client.pem", "-days", "1", "-extfile", "client-ext"],
                   cwd=work, check=True, capture_output=True)
    server = NatsServer(str(work / "nats"), extra_conf=(
        f'tls {{ cert_file: "{certs["cert"]}", key_file: "{certs["key"]}", ca_file: "{certs["ca"]}", '
        'verify: true }')).start()
    try:
        base = Settings(nats_url=f"tls://127.0.0.1:{server.port}", nats_credentials=server.credentials_file,
                        nats_tls_ca=certs["ca"])
        bus = await Bus.connect(Settings(**{**base.__dict__, "nats_tls_cert": str(work / "client.pem"),
                                            "nats_tls_key": str(work / "client.key")}), "c", name="gateway")
        try:
            assert bus.nc.is_connected
            await bus.nc.flush(timeout=5)
        finally:
            await bus.close()
        creds = json.loads(Path(server.credentials_file).read_text())
        errors: list[str] = []

        async def on_error(exc):
            errors.append(f"{type(exc).__name__}: {exc}")

        with pytest.raises(Exception):
            await nats.connect(base.nats_url, user="gateway", password=creds["gateway"],
                               tls=ssl.create_default_context(cafile=certs["ca"]), allow_reconnect=False,
                               max_reconnect_attempts=0, connect_timeout=2, error_cb=on_error)
        # the client sees the alert or, depending on timing, only the connection reset; the
        # server says why
        assert errors, "the connection without a client certificate was not refused"
        await asyncio.sleep(0.2)
        assert "didn't provide a certificate" in Path(server.log_path).read_text(), errors
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


async def test_services_reach_postgresql_over_tls_and_a_plain_connection_is_refused(make_settings):
    """PostgreSQL over TLS like NATS (issue 22): the server requires TLS of TCP clients
    (``hostnossl ... reject``); the services' TIMESHARE_DATABASE_URL says
    ``sslmode=verify-full&sslrootcert=<CA>``; a plain connection, or one that does not trust the
    CA, is refused."""
    import asyncpg

    from services.devstack.servers import PostgresServer

    work = Path(tempfile.mkdtemp(prefix="timeshare-pgtls-"))
    os.chmod(work, 0o755)  # the postgres user reads the certificate copies from its data dir
    certs = _certs(work)
    pg = PostgresServer(tls_cert=certs["cert"], tls_key=certs["key"], tls_ca=certs["ca"]).start()
    try:
        admin = await asyncpg.connect(pg.dsn + pg.dsn_query)
        await admin.execute("CREATE DATABASE tlsdb")
        await admin.close()
        url = pg.dsn.rsplit("/", 1)[0] + "/tlsdb" + pg.dsn_query
        stack = await Stack(make_settings(database_url=url)).start()
        try:
            async with httpx.AsyncClient(base_url=stack["gateway"].url,
                                         headers={"Authorization": "Bearer tok-carol"}) as http:
                r = await http.post("/v1/workloads", json={"id": "over-tls", "project": "alpha/train",
                                                           "gpu_type": "H100", "gpus": 1, "work_s": 1})
                assert r.status_code == 202, r.text

                async def stored():
                    return (await http.get("/v1/workloads/over-tls")).status_code == 200

                deadline = asyncio.get_running_loop().time() + 15
                while not await stored():
                    assert asyncio.get_running_loop().time() < deadline, "the workload never reached the store"
                    await asyncio.sleep(0.1)
            # every connection of the services' pools is encrypted
            conn = await asyncpg.connect(url)
            try:
                rows = await conn.fetch("SELECT ssl FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) "
                                        "WHERE datname = 'tlsdb' AND backend_type = 'client backend'")
                assert len(rows) >= 2 and all(r["ssl"] for r in rows), rows
            finally:
                await conn.close()
        finally:
            await stack.stop()
        # plain text: refused by the server
        with pytest.raises(asyncpg.exceptions.InvalidAuthorizationSpecificationError, match="no encryption"):
            await asyncpg.connect(pg.dsn.rsplit("/", 1)[0] + "/tlsdb?sslmode=disable")
        # TLS trusting another CA: refused by the client
        other = work / "other"
        other.mkdir()
        other_ca = _certs(other)["ca"]
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncpg.connect(pg.dsn.rsplit("/", 1)[0] + f"/tlsdb?sslmode=verify-full&sslrootcert={other_ca}")
    finally:
        pg.stop()
        shutil.rmtree(pg.data_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
