"""Every exception the coordinator raises on purpose.

::

    CoordinatorError                 root: catch this to catch anything we raise
     ├── FatalError                  the process cannot go on; `python -m coordinator` exits
     │    ├── ConfigError            a setting is unknown, mistyped or out of range
     │    ├── ServerStartError       a listener could not be opened (port in use, bad host)
     │    ├── StoreError             the durable store cannot be opened or written
     │    └── CertificateError       the CA or server certificate cannot be loaded or created
     └── RecoverableError            one request or session fails; the process carries on
          ├── ProtocolError          an agent broke the Session protocol (wrong first message, ...)
          ├── UnknownAgentError      a lookup named an agent the registry does not know
          ├── UnknownTokenRefError   an admin command named a join token that does not exist
          ├── FleetFullError         a new agent id beyond ``max_agents``
          ├── SignInsFullError       a dashboard sign-in beyond ``MAX_SESSIONS`` live ones
          └── EnrollmentError        a join token or an agent credential was refused
               ├── UnknownTokenError        no such token (or a wrong secret)
               ├── TokenExpiredError        past its expiry
               ├── TokenExhaustedError      used up
               ├── TokenRevokedError        revoked by an operator
               ├── SiteMismatchError        bound to another site
               ├── AuthenticationError      credentials missing or wrong, not enrolled, no mTLS
               ├── PermissionDeniedError    a valid identity, but another agent's
               ├── AgentRevokedError        the agent (or its certificate) was revoked
               ├── CertificateRequestError  a CSR that cannot be signed
               ├── SessionTakenError        the agent id has a live session (no replacing it)
               └── FixedIdentityError       Hello contradicts what the operator fixed (URL)

Errors from libraries (grpc, aiohttp, tomllib) are converted where they are
caught, with ``raise ... from exc``.
"""

from __future__ import annotations


class CoordinatorError(Exception):
    """Root of every error the coordinator raises."""


class FatalError(CoordinatorError):
    """The coordinator process cannot continue."""


class ConfigError(FatalError):
    """The configuration is invalid; the message names the key and where it came from."""


class ServerStartError(FatalError):
    """A gRPC or HTTP listener could not be started."""


class RecoverableError(CoordinatorError):
    """One request or session failed; the coordinator keeps serving."""


class ProtocolError(RecoverableError):
    """An agent sent something the Session protocol does not allow."""


class UnknownAgentError(RecoverableError):
    """No agent with this id is known to the registry."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"unknown agent {agent_id!r}")
        self.agent_id = agent_id


class StoreError(FatalError):
    """The durable store (SQLite) cannot be opened or written."""


class CertificateError(FatalError):
    """The coordinator's CA or server certificate cannot be loaded or created."""


class EnrollmentError(RecoverableError):
    """A join token or agent credential was refused; ``reason`` is a short metric label."""

    reason = "rejected"


class UnknownTokenError(EnrollmentError):
    """No join token matches (wrong id or wrong secret)."""

    reason = "unknown_token"


class TokenExpiredError(EnrollmentError):
    reason = "expired_token"


class TokenExhaustedError(EnrollmentError):
    """The token was used as many times as it allows."""

    reason = "exhausted_token"


class TokenRevokedError(EnrollmentError):
    reason = "revoked_token"


class SiteMismatchError(EnrollmentError):
    """The token is bound to another site than the agent asked for."""

    reason = "site_mismatch"


class AuthenticationError(EnrollmentError):
    """A session's credentials or client certificate do not prove the agent id it claims."""

    reason = "unauthenticated"


class PermissionDeniedError(EnrollmentError):
    """The caller is authenticated, but as someone else (e.g. another agent's certificate)."""

    reason = "permission_denied"


class UnknownTokenRefError(RecoverableError):
    """An admin command named a join token id that does not exist."""

    def __init__(self, token_id: str) -> None:
        super().__init__(f"unknown join token {token_id!r}")
        self.token_id = token_id


class AgentRevokedError(PermissionDeniedError):
    """The agent, or the certificate it presents, was revoked by an operator."""

    reason = "revoked"


class CertificateRequestError(EnrollmentError):
    """A CSR is malformed, badly signed or for an unsupported key type."""

    reason = "bad_csr"


class SessionTakenError(EnrollmentError):
    """An unauthenticated Hello names an agent that has a live session."""

    reason = "session_taken"


class FixedIdentityError(PermissionDeniedError):
    """A Hello says something other than what the operator fixed (e.g. its URL)."""

    reason = "identity_mismatch"


class UnknownApiKeyError(RecoverableError):
    """An admin command named an API key id that does not exist."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"unknown API key {key_id!r}")
        self.key_id = key_id


class FleetFullError(RecoverableError):
    """A Hello for a new agent id when the registry already holds ``max_agents``."""


class SignInsFullError(RecoverableError):
    """A dashboard sign-in when the database already keeps the most live sign-ins."""


class SigningKeyError(FatalError):
    """The model-signing key in the data directory cannot be read or created."""


class ModelCatalogError(RecoverableError):
    """A catalog request was refused; ``status`` and ``code`` say how the API answers."""

    status = 400
    code = "invalid_model"
    param: str | None = None


class UnknownModelVersionError(ModelCatalogError):
    """No such model name@version (or blob) in the catalog."""

    status = 404
    code = "model_not_found"
    param = "model"


class ModelVersionExistsError(ModelCatalogError):
    """A version with this name and version is already published (with other bytes)."""

    status = 409
    code = "model_version_exists"
    param = "version"


class ModelInUseError(ModelCatalogError):
    """A version cannot be deleted: agents desire it or have it loaded."""

    status = 409
    code = "model_in_use"
    param = "model"


class BlobIntegrityError(ModelCatalogError):
    """An uploaded blob's bytes do not hash to the sha256 it was sent under."""

    status = 400
    code = "blob_sha256_mismatch"
    param = "sha256"


class MissingBlobsError(ModelCatalogError):
    """A manifest names files the blob store does not hold (upload them first)."""

    status = 409
    code = "missing_blobs"
    param = "manifest"

    def __init__(self, missing: list[str]) -> None:
        super().__init__(
            f"the blob store lacks {len(missing)} file(s) the manifest lists (upload them "
            f"first): {', '.join(missing[:5])}"
        )
        self.missing = missing
