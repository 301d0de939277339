"""The rules behind issue 13, as tables: tokens, membership and visibility, tree changes."""

from __future__ import annotations

import json

import pytest

from services.common.auth import Caller, TokenTable, token_hash
from services.common.nats_auth import PERMISSIONS, ROLES, role_of, server_config
from timeshare.tree import AllocationTree, TreeError, check_change, check_removal

TREE = AllocationTree.from_shares({"research": 3, "research/rl": 1, "research/llm": 2, "product": 1})


def test_the_token_table_keeps_digests_and_finds_a_caller_by_the_token():
    table = TokenTable({token_hash("alpha-secret"): {"user": "alice", "member_of": ["research/rl"]},
                        "plain-dev-token": {"user": "dev"}})
    assert table.lookup("alpha-secret").user == "alice"
    assert table.lookup("plain-dev-token").user == "dev"
    assert table.lookup(token_hash("alpha-secret")) is None  # the digest is not a token
    assert table.lookup("") is None and table.lookup("alpha-secreT") is None
    assert all(len(d) == 32 for d, _ in table.entries)  # nothing but digests kept
    with pytest.raises(ValueError, match="unknown field 'member'"):
        TokenTable({"t": {"user": "x", "member": ["a"]}})


CALLERS = {
    "a member of research/rl": Caller("rita", member_of=("research/rl",)),
    "the manager of research": Caller("mona", manages=("research",)),
    "an admin": Caller("root", admin=True),
    "someone in product": Caller("pete", member_of=("product",)),
}
SUBMIT = {  # caller -> may submit to research/rl, research/llm
    "a member of research/rl": (True, False),
    "the manager of research": (True, True),
    "an admin": (True, True),
    "someone in product": (False, False),
}


@pytest.mark.parametrize("sentence", sorted(SUBMIT))
def test_who_may_submit_where_and_see_what(sentence):
    who = CALLERS[sentence]
    assert (who.may_submit_to("research/rl"), who.may_submit_to("research/llm")) == SUBMIT[sentence]
    others = {"user": "someone-else", "project": "research/rl"}
    assert who.may_see({"user": who.user, "project": "product"})  # one's own, wherever
    assert who.may_see(others) == (sentence in ("the manager of research", "an admin"))


CHANGES = {
    "a new leaf under a parent": ({"research/vision": 1}, {}, None),
    "a zero share (no budget)": ({"product": 0}, {}, None),
    "a leaf with work becomes a parent": ({"research/rl/sub": 1}, {"research/rl": 2}, "research/rl is a leaf holding 2"),
    "a leaf without work becomes a parent": ({"research/rl/sub": 1}, {"research/llm": 1}, None),
    "NaN": ({"product": float("nan")}, {}, "finite"),
    "inf": ({"product": float("inf")}, {}, "finite"),
    "negative": ({"product": -1}, {}, "negative"),
    "4e16": ({"product": 4e16}, {}, "above the maximum"),
    "a boolean": ({"product": True}, {}, "finite number"),
    "a control character": ({"research/\x0e": 1}, {}, "node name"),
    "upper case": ({"COM1": 1}, {}, "node name 'COM1'"),
    "a device name": ({"research/aux": 1}, {}, "reserved"),
    "a dot": ({"research/..": 1}, {}, "node name"),
    "too deep": ({"research/" + "/".join("abcdefgh"): 1}, {}, "levels deep"),
    "an unknown parent": ({"nowhere/x": 1}, {}, "unknown parent"),
}


@pytest.mark.parametrize("sentence", sorted(CHANGES))
def test_tree_changes(sentence):
    shares, work, refusal = CHANGES[sentence]
    if refusal is None:
        new = check_change(TREE, shares, work)
        assert all(new.nodes[p].share == s for p, s in shares.items())
    else:
        with pytest.raises(TreeError, match=refusal.replace("(", r"\(")):
            check_change(TREE, shares, work)


def test_a_node_is_retired_only_when_no_work_is_charged_below_it():
    with pytest.raises(TreeError, match="still holds pending or running work: research/rl \\(1\\)"):
        check_removal(TREE, "research", {"research/rl": 1})
    assert "research" not in check_removal(TREE, "research", {"product": 3}).nodes
    assert check_removal(TREE, "research/rl", {}).nodes["research"].is_leaf is False
    with pytest.raises(TreeError, match="unknown allocation"):
        check_removal(TREE, "nowhere", {})
    with pytest.raises(TreeError, match="only top-level node"):
        check_removal(AllocationTree.from_shares({"a": 1, "a/b": 1}), "a", {})


def test_only_placement_may_append_to_the_log_and_only_the_gateway_sends_commands():
    def may_publish(role: str, subject: str) -> bool:
        def match(pattern: str) -> bool:
            p, s = pattern.split("."), subject.split(".")
            for i, tok in enumerate(p):
                if tok == ">":
                    return len(s) > i
                if i >= len(s) or (tok != "*" and tok != s[i]):
                    return False
            return len(p) == len(s)
        return any(match(p) for p in PERMISSIONS[role]["publish"])

    services = [r for r in ROLES if r != "operator"]
    assert [r for r in services if may_publish(r, "timeshare.v1.c.workload.started")] == ["placement"]
    assert [r for r in services if may_publish(r, "timeshare.cmd.v1.c.budget.set")] == ["gateway"]
    assert [r for r in services if may_publish(r, "timeshare.in.v1.c.budget.changed")] == ["budget"]
    assert [r for r in services if may_publish(r, "timeshare.in.v1.c.workload.completed")] == ["executor"]
    assert [r for r in services if may_publish(r, "$O.timeshare_snapshots.M.x")] == ["placement"]
    assert role_of("placement-1a2b") == "placement" and role_of("killed-gateway") == "operator"
    conf = server_config({r: f"pw-{r}" for r in ROLES})
    assert conf.startswith("authorization {") and json.loads(conf[len("authorization "):])["users"][0]["user"]


def _allows(patterns: list[str], subject: str) -> bool:
    def match(pattern: str) -> bool:
        p, s = pattern.split("."), subject.split(".")
        for i, tok in enumerate(p):
            if tok == ">":
                return len(s) > i
            if i >= len(s) or (tok != "*" and tok != s[i]):
                return False
        return len(p) == len(s)
    return any(match(p) for p in patterns)


def test_every_faststream_subscriber_fits_its_services_nats_user():
    """The handlers (services/<name>/handlers.py) are core-NATS subscribers on a broker logged in
    as the service's user: each subject must be in that user's subscribe list, no other service
    may subscribe to it, and the service needs no right to publish there (replies go to the
    asker's _INBOX, allowed by allow_responses)."""
    import importlib

    from faststream.nats.subscriber.usecases.core_subscriber import CoreSubscriber

    from services.common.broker import make_broker
    from services.common.settings import Settings
    from services.schemas import HANDLER_SERVICES

    for name in HANDLER_SERVICES:
        broker = make_broker(Settings(), name, importlib.import_module(f"services.{name}.handlers").router(None, "c"))
        assert broker.subscribers, name
        for sub in broker.subscribers:
            # a core subscriber, no JetStream push consumer with a delivery subject of its own
            assert isinstance(sub, CoreSubscriber), (name, sub)
            subject = sub.subject.broker_address
            assert _allows(PERMISSIONS[name]["subscribe"], subject), (name, subject)
            others = [r for r in ROLES if r not in (name, "operator") and _allows(PERMISSIONS[r]["subscribe"], subject)]
            # one exception, by design: the trace query is a scatter-gather that every process
            # keeping spans answers (placement and the executor), each with its own spans
            expected = sorted({"placement", "executor"} - {name}) if subject.endswith(".trace") else []
            assert others == expected, (subject, others)


def test_only_placement_purges_the_log_and_the_executor_may_read_snapshots():
    services = [r for r in ROLES if r != "operator"]
    assert [r for r in services if _allows(PERMISSIONS[r]["publish"], "$JS.API.STREAM.PURGE.TIMESHARE")] == \
        ["placement"]
    # the executor starts from placement's snapshot: stream info, direct/last-message gets and an
    # ordered consumer delivering to its _INBOX; writing the bucket stays placement's
    for subject in ("$JS.API.STREAM.INFO.OBJ_timeshare_snapshots", "$JS.API.DIRECT.GET.OBJ_timeshare_snapshots",
                    "$JS.API.STREAM.MSG.GET.OBJ_timeshare_snapshots",
                    "$JS.API.CONSUMER.CREATE.OBJ_timeshare_snapshots"):
        assert _allows(PERMISSIONS["executor"]["publish"], subject), subject
    assert _allows(PERMISSIONS["executor"]["subscribe"], "_INBOX.abc")
    assert not _allows(PERMISSIONS["executor"]["publish"], "$O.timeshare_snapshots.M.x")


def test_the_handlers_broker_logs_in_as_the_service_user():
    from services.common.broker import _security
    from services.common.settings import Settings

    settings = Settings(nats_credentials=json.dumps({r: f"pw-{r}" for r in ROLES}))
    for name, user in (("budget", "budget"), ("placement-1a2b", "placement"), ("timeshare", "operator")):
        s = _security(settings, name)
        assert (s.username, s.password) == (user, f"pw-{user}")
    assert _security(Settings(), "budget") is None
