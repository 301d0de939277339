"""Bearer tokens -> a caller (user, the tree nodes they manage, admin or not)."""

from __future__ import annotations

from dataclasses import dataclass

from timeshare.tree import is_within


@dataclass(frozen=True)
class Caller:
    user: str
    manages: tuple[str, ...] = ()
    admin: bool = False

    def manages_path(self, path: str) -> bool:
        return self.admin or any(is_within(path, m) for m in self.manages)

    def may_change_share_of(self, path: str) -> bool:
        """A manager changes the shares of the children (and deeper) of nodes they manage."""
        if self.admin:
            return True
        parent = path.rsplit("/", 1)[0] if "/" in path else None
        return parent is not None and any(is_within(parent, m) for m in self.manages)

    def to_dict(self) -> dict:
        return {"user": self.user, "manages": list(self.manages), "admin": self.admin}

    @classmethod
    def from_dict(cls, d: dict) -> "Caller":
        return cls(str(d["user"]), tuple(d.get("manages") or ()), bool(d.get("admin", False)))


class TokenTable:
    def __init__(self, table: dict[str, dict]):
        self.callers = {}
        for token, entry in table.items():
            if "user" not in entry:
                raise ValueError(f"token {token[:4]}...: missing 'user'")
            self.callers[token] = Caller.from_dict(entry)

    def lookup(self, token: str) -> Caller | None:
        return self.callers.get(token)
