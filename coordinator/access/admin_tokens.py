"""Admin tokens: who may read and steer the fleet, with a role each.

A minted token reads ``efa_<id>.<secret>`` (256-bit random secret, shown once). The
database keeps the id, a name, the role and the SHA-256 of the secret; a presented token
is hashed and its digest compared as bytes in constant time. One more token, the
bootstrap admin token, comes from ``admin_token_file`` or
``$EDGEFLEET_COORDINATOR_ADMIN_TOKEN`` (never a flag); it has the admin role and is
compared as bytes in constant time too. Being on loopback grants nothing.

What is kept beyond a request for a caller (a dashboard sign-in) is the token's id, never
the token (``kept_id``); ``check_id`` turns that id back into a caller while the token is
still valid, reading its name and role from the store each time. The bootstrap token's
kept id carries a fingerprint of it (a slow salted hash), so that sign-ins made with a
bootstrap token are refused once the coordinator is given another one.
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
from coordinator.store.admin_tokens import AdminTokenRecord, AdminTokenTable

PREFIX = "efa_"
_TOKEN = re.compile(r"^efa_(?P<id>[0-9a-f]{12})\.(?P<secret>[A-Za-z0-9_-]{43})$")
# The shortest bootstrap token accepted (minted tokens are 60 characters).
MIN_TOKEN_LENGTH = 32
MAX_NAME_LENGTH = 64
BOOTSTRAP_ID = "bootstrap"
_MINTED_ID = re.compile(r"^[0-9a-f]{12}$")
# The bootstrap token's fingerprint in a kept id: PBKDF2-SHA256 of it (computed once).
_FINGERPRINT_SALT = b"edgefleet bootstrap admin token fingerprint"
_FINGERPRINT_ROUNDS = 100_000


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
    """Mint, list, revoke and check admin tokens (table admin_tokens in the store)."""

    def __init__(self, store: AdminTokenTable, *, bootstrap_token: str = "") -> None:
        if bootstrap_token and len(bootstrap_token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"the bootstrap admin token needs {MIN_TOKEN_LENGTH}+ characters")
        self._store = store
        self._bootstrap = _as_bytes(bootstrap_token) if bootstrap_token else b""
        self._bootstrap_kept_id = ""  # computed on first use (a slow hash)

    async def mint(self, role: Role, name: str, *, created_by: str = "") -> NewAdminToken:
        name = check_name(name)
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)  # 256 bits, 43 characters
        now = datetime.now(UTC)
        digest = _digest(secret.encode()).hex()
        await self._store.add_admin_token(
            AdminTokenRecord(token_id, name, role.label, digest, now, created_by)
        )
        record = AdminToken(token_id, name, role, now, created_by, None)
        return NewAdminToken(token=f"{PREFIX}{token_id}.{secret}", record=record)

    async def list(self) -> list[AdminToken]:
        return [_token(r) for r in await self._store.list_admin_tokens()]

    async def revoke(self, token_id: str) -> AdminToken:
        if not await self._store.revoke_admin_token(token_id, datetime.now(UTC)):
            raise UnknownAdminTokenError(token_id)
        record = await self._store.get_admin_token(token_id)
        if record is None:  # removed in between: nothing does that
            raise UnknownAdminTokenError(token_id)
        return _token(record)

    async def check(self, presented: str) -> Caller | None:
        """The caller a presented token stands for; None when it is not a valid token."""
        given = _as_bytes(presented)
        if self._bootstrap and hmac.compare_digest(given, self._bootstrap):
            return Caller(BOOTSTRAP_ID, "bootstrap", Role.ADMIN)
        match = _TOKEN.match(presented)
        if match is None:
            return None
        found = await self._store.get_admin_token(match["id"])
        if found is not None and found.revoked_at is not None:
            found = None
        digest = _digest(match["secret"].encode())
        # Compared even when the id is unknown, so both paths cost the same.
        stored = bytes.fromhex(found.secret_sha256) if found is not None else bytes(32)
        if not hmac.compare_digest(digest, stored) or found is None:
            return None
        return Caller(match["id"], found.name, Role.parse(found.role))

    def kept_id(self, caller: Caller) -> str:
        """The id to keep for the token a caller presented (``check_id`` takes it back):
        a minted token's id; for the bootstrap token ``bootstrap.`` and its fingerprint."""
        if caller.token_id != BOOTSTRAP_ID:
            return caller.token_id
        if not self._bootstrap_kept_id:
            fingerprint = hashlib.pbkdf2_hmac(
                "sha256", self._bootstrap, _FINGERPRINT_SALT, _FINGERPRINT_ROUNDS
            )
            self._bootstrap_kept_id = f"{BOOTSTRAP_ID}.{fingerprint[:16].hex()}"
        return self._bootstrap_kept_id

    async def check_id(self, token_id: str) -> Caller | None:
        """The caller of the token ``kept_id`` named, read now; None once the token is
        revoked or unknown, or (the bootstrap token) this coordinator has another one or
        none. The name and role are the token's as they are now."""
        if token_id.startswith(f"{BOOTSTRAP_ID}."):
            if not self._bootstrap:
                return None
            bootstrap = Caller(BOOTSTRAP_ID, "bootstrap", Role.ADMIN)
            expected = self.kept_id(bootstrap).encode()
            return bootstrap if hmac.compare_digest(token_id.encode(), expected) else None
        if _MINTED_ID.match(token_id) is None:
            return None
        found = await self._store.get_admin_token(token_id)
        if found is None or found.revoked_at is not None:
            return None
        return Caller(token_id, found.name, Role.parse(found.role))


def _token(record: AdminTokenRecord) -> AdminToken:
    return AdminToken(
        token_id=record.token_id,
        name=record.name,
        role=Role.parse(record.role),
        created_at=record.created_at,
        created_by=record.created_by,
        revoked_at=record.revoked_at,
    )
