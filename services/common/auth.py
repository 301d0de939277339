"""Bearer tokens -> a caller (user, the leaves they belong to, the nodes they manage, admin or not).

The token table (``TIMESHARE_TOKENS``: JSON or a file) is keyed by ``sha256:<hex digest of the
token>``: the gateway never needs the token itself, so a leaked table or store grants nothing.
A plain token as a key is still read (hashed at once, never kept) with a warning, for
throwaway test and dev tables; ``timeshare token new`` prints a fresh token and its entry.

Who may do what:
* **submit** to a leaf: a member of it (``member_of`` lists leaves or subtrees), a manager of a
  subtree holding it, or an admin; anyone else would spend a budget that is not theirs;
* **see** a workload (its command line included): its owner, a manager of its project's
  subtree, an admin;
* **change shares** of the children of nodes they manage (admins: any).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass

from timeshare.tree import is_within

log = logging.getLogger("timeshare.auth")

HASH_PREFIX = "sha256:"


def token_hash(token: str) -> str:
    """The table key of ``token``: ``sha256:<hex>``."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Caller:
    user: str
    manages: tuple[str, ...] = ()
    admin: bool = False
    #: leaves (or subtrees) whose budget this user may spend
    member_of: tuple[str, ...] = ()

    def manages_path(self, path: str) -> bool:
        return self.admin or any(is_within(path, m) for m in self.manages)

    def may_submit_to(self, path: str) -> bool:
        return self.manages_path(path) or any(is_within(path, m) for m in self.member_of)

    def may_see(self, doc: dict) -> bool:
        """A workload document of the gateway's projection (``user``, ``project``)."""
        return doc.get("user") == self.user or self.manages_path(str(doc.get("project", "")))

    def may_change_share_of(self, path: str) -> bool:
        """A manager changes the shares of the children (and deeper) of nodes they manage."""
        if self.admin:
            return True
        parent = path.rsplit("/", 1)[0] if "/" in path else None
        return parent is not None and any(is_within(parent, m) for m in self.manages)

    def to_dict(self) -> dict:
        return {"user": self.user, "manages": list(self.manages), "admin": self.admin,
                "member_of": list(self.member_of)}

    @classmethod
    def from_dict(cls, d: dict) -> "Caller":
        return cls(str(d["user"]), tuple(d.get("manages") or ()), bool(d.get("admin", False)),
                   tuple(d.get("member_of") or ()))


class TokenTable:
    def __init__(self, table: dict[str, dict]):
        #: (sha256 digest bytes, caller); compared in constant time, every entry every time
        self.entries: list[tuple[bytes, Caller]] = []
        plain = 0
        for key, entry in table.items():
            if not isinstance(entry, dict) or "user" not in entry:
                raise ValueError(f"token {key[:12]}...: missing 'user'")
            unknown = set(entry) - {"user", "manages", "admin", "member_of"}
            if unknown:
                raise ValueError(f"token entry of {entry['user']!r}: unknown field {sorted(unknown)[0]!r} "
                                 "(known: user, manages, member_of, admin)")
            if key.startswith(HASH_PREFIX):
                digest = bytes.fromhex(key[len(HASH_PREFIX):])
                if len(digest) != 32:
                    raise ValueError(f"token entry of {entry['user']!r}: {key[:20]}... is not a sha256 digest")
            else:
                plain += 1
                digest = hashlib.sha256(key.encode()).digest()
            self.entries.append((digest, Caller.from_dict(entry)))
        if plain:
            log.warning("%d token(s) given in plain text; store 'sha256:<hex>' keys instead "
                        "(timeshare token new)", plain)

    def lookup(self, token: str) -> Caller | None:
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for known, who in self.entries:  # no early exit: the time taken does not say which matched
            if hmac.compare_digest(known, digest):
                found = who
        return found
