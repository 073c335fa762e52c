"""Admin tokens: who may read and steer the fleet, with a role each.

A minted token reads ``efa_<id>.<secret>`` (256-bit random secret, shown once). The
database keeps the id, a name, the role and the SHA-256 of the secret; a presented token
is hashed and its digest compared as bytes in constant time. One more token, the
bootstrap admin token, comes from ``admin_token_file`` or
``$EDGEFLEET_COORDINATOR_ADMIN_TOKEN`` (never a flag); it has the admin role and is
compared as bytes in constant time too. Being on loopback grants nothing.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime

from coordinator.errors import UnknownTokenRefError
from coordinator.store.admin_db import AdminDatabase

PREFIX = "efa_"
_TOKEN = re.compile(r"^efa_(?P<id>[0-9a-f]{12})\.(?P<secret>[A-Za-z0-9_-]{43})$")
# The shortest bootstrap token accepted (minted tokens are 60 characters).
MIN_TOKEN_LENGTH = 32
MAX_NAME_LENGTH = 64
BOOTSTRAP_ID = "bootstrap"


class UnknownAdminTokenError(UnknownTokenRefError):
    """An admin command named an admin token id that does not exist (404)."""

    def __init__(self, token_id: str) -> None:
        super().__init__(token_id)
        self.args = (f"unknown admin token {token_id!r}",)


class Role(enum.IntEnum):
    """What a token may do; each role may do everything the ones below it may."""

    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Role:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"role must be viewer, operator or admin, got {text!r}") from None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who presented a valid token."""

    token_id: str
    name: str
    role: Role


@dataclass(frozen=True, slots=True)
class AdminToken:
    token_id: str
    name: str
    role: Role
    created_at: datetime
    created_by: str
    revoked_at: datetime | None

    def json(self) -> dict[str, object]:
        return {
            "object": "admin_token",
            "token_id": self.token_id,
            "name": self.name,
            "role": self.role.label,
            "created_at": _iso(self.created_at),
            "created_by": self.created_by,
            "revoked_at": None if self.revoked_at is None else _iso(self.revoked_at),
            "state": "revoked" if self.revoked_at is not None else "active",
        }


@dataclass(frozen=True, slots=True)
class NewAdminToken:
    token: str = field(repr=False)
    record: AdminToken


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def _as_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def check_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > MAX_NAME_LENGTH or not name.isprintable():
        raise ValueError(f"a token name is 1 to {MAX_NAME_LENGTH} printable characters")
    return name


class AdminTokens:
    """Mint, list, revoke and check admin tokens."""

    def __init__(self, db: AdminDatabase, *, bootstrap_token: str = "") -> None:
        if bootstrap_token and len(bootstrap_token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"the bootstrap admin token needs {MIN_TOKEN_LENGTH}+ characters")
        self._db = db
        self._bootstrap = _as_bytes(bootstrap_token) if bootstrap_token else b""

    def mint(self, role: Role, name: str, *, created_by: str = "") -> NewAdminToken:
        name = check_name(name)
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)  # 256 bits, 43 characters
        now = datetime.now(UTC)
        with self._db.transaction() as db:
            db.execute(
                "INSERT INTO admin_tokens (token_id, name, role, secret_sha256, created_at,"
                " created_by) VALUES (?, ?, ?, ?, ?, ?)",
                (token_id, name, role.label, _digest(secret.encode()).hex(), now.isoformat(),
                 created_by),
            )  # fmt: skip
        record = AdminToken(token_id, name, role, now, created_by, None)
        return NewAdminToken(token=f"{PREFIX}{token_id}.{secret}", record=record)

    def list(self) -> list[AdminToken]:
        rows = self._db.query("SELECT * FROM admin_tokens ORDER BY created_at, token_id")
        return [
            AdminToken(
                token_id=r["token_id"],
                name=r["name"],
                role=Role.parse(r["role"]),
                created_at=datetime.fromisoformat(r["created_at"]),
                created_by=r["created_by"],
                revoked_at=None
                if r["revoked_at"] is None
                else datetime.fromisoformat(r["revoked_at"]),
            )
            for r in rows
        ]

    def revoke(self, token_id: str) -> AdminToken:
        with self._db.transaction() as db:
            db.execute(
                "UPDATE admin_tokens SET revoked_at = ? WHERE token_id = ? AND revoked_at IS NULL",
                (datetime.now(UTC).isoformat(), token_id),
            )
            exists = db.execute(
                "SELECT 1 FROM admin_tokens WHERE token_id = ?", (token_id,)
            ).fetchone()
        if not exists:
            raise UnknownAdminTokenError(token_id)
        return next(t for t in self.list() if t.token_id == token_id)

    def check(self, presented: str) -> Caller | None:
        """The caller a presented token stands for; None when it is not a valid token."""
        given = _as_bytes(presented)
        if self._bootstrap and hmac.compare_digest(given, self._bootstrap):
            return Caller(BOOTSTRAP_ID, "bootstrap", Role.ADMIN)
        match = _TOKEN.match(presented)
        if match is None:
            return None
        rows = self._db.query(
            "SELECT name, role, secret_sha256 FROM admin_tokens"
            " WHERE token_id = ? AND revoked_at IS NULL",
            match["id"],
        )
        digest = _digest(match["secret"].encode())
        # Compared even when the id is unknown, so both paths cost the same.
        stored = bytes.fromhex(rows[0]["secret_sha256"]) if rows else bytes(32)
        if not hmac.compare_digest(digest, stored) or not rows:
            return None
        return Caller(match["id"], rows[0]["name"], Role.parse(rows[0]["role"]))
