"""The fold of who may connect or call: API keys created and revoked, certificates revoked,
and the connections refused for a certificate that did not prove its node or for what its
node claimed (recorded for the audit trail only: they change no state)."""

from __future__ import annotations

from msgspec.structs import replace

from app.domain.envelope import Recorded
from app.domain.events import (
    ApiKeyCreated,
    ApiKeyRevoked,
    CertificateRevoked,
    Event,
    IdentityRejected,
    NodeRefused,
)
from app.domain.evolve.updates import Handler
from app.domain.state import ApiKey, CertificateRevocation, ClusterState


def _api_key_created(state: ClusterState, event: ApiKeyCreated, recorded: Recorded) -> None:
    at = recorded.recorded_at
    state.keys[event.key_id] = ApiKey(
        id=event.key_id,
        name=event.name,
        prefix=event.prefix,
        secret_hash=event.secret_hash,
        models=event.models,
        rpm=event.rpm,
        tpm=event.tpm,
        created_at=at,
        created_by=recorded.meta.actor,
        expires_at=event.expires_at,
    )


def _api_key_revoked(state: ClusterState, event: ApiKeyRevoked, recorded: Recorded) -> None:
    at = recorded.recorded_at
    key = state.keys.get(event.key_id)
    if key is not None and key.revoked_at is None:
        state.keys[event.key_id] = replace(key, revoked_at=at, revoked_by=recorded.meta.actor)


def _certificate_revoked(
    state: ClusterState, event: CertificateRevoked, recorded: Recorded
) -> None:
    revocation = CertificateRevocation(
        serial=event.serial,
        node_id=event.node_id,
        reason=event.reason,
        revoked_at=recorded.recorded_at,
        revoked_by=recorded.meta.actor,
    )
    state.revocations[revocation.key] = revocation


def _identity_rejected(state: ClusterState, event: IdentityRejected, recorded: Recorded) -> None:
    """Recorded for the audit trail; a refused connection is not state."""


def _node_refused(state: ClusterState, event: NodeRefused, recorded: Recorded) -> None:
    """An audit record only: the refused connection changed nothing."""


HANDLERS: dict[type[Event], Handler] = {
    IdentityRejected: _identity_rejected,
    NodeRefused: _node_refused,
    CertificateRevoked: _certificate_revoked,
    ApiKeyCreated: _api_key_created,
    ApiKeyRevoked: _api_key_revoked,
}
"""The events this module folds, each with its handler."""
