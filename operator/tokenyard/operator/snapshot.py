"""One ModelDeployment as a reconcile sees it: parsed once from Kopf's body at the start of the reconcile.

Kopf hands a daemon a live view of the object that changes under it between awaits; a reconcile that reads
its spec at one point and its status at another can mix two versions. The snapshot is taken once, typed, and
is what the reconcile passes around. Kopf's events still need the raw body: `kube_writes.Events` wraps it,
and is the only thing that holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenyard.core import labels as keys
from tokenyard.core.types import ModelDeploymentSpec


@dataclass(frozen=True)
class DeploymentMeta:
    """What identifies the object and what its status is written against; readable even when the spec is not."""

    name: str
    namespace: str
    uid: str
    generation: int | None
    status: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> DeploymentMeta:
        metadata = body["metadata"]
        return cls(
            name=metadata["name"],
            namespace=metadata["namespace"],
            uid=metadata.get("uid", ""),
            generation=metadata.get("generation"),
            # Plain copies: the body is live and must not change the snapshot after it is taken.
            status=_plain(body.get("status") or {}),
            annotations=dict(metadata.get("annotations") or {}),
        )

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": keys.API_VERSION,
            "kind": "ModelDeployment",
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class DeploymentSnapshot:
    meta: DeploymentMeta
    spec: ModelDeploymentSpec

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> DeploymentSnapshot:
        """Raises pydantic's ValidationError when the spec is invalid (the CRD schema let it through)."""
        return cls(DeploymentMeta.from_body(body), ModelDeploymentSpec.parse(_plain(body["spec"])))

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def namespace(self) -> str:
        return self.meta.namespace

    @property
    def status(self) -> Mapping[str, Any]:
        return self.meta.status

    def spec_of_revision(self, revision: str, update_revision: str) -> ModelDeploymentSpec | None:
        """The spec a revision's groups are made from: the current one, or an older one from the history."""
        if revision == update_revision:
            return self.spec
        for record in self.status.get("revisionHistory") or []:
            if record.get("revision") == revision and record.get("template"):
                return ModelDeploymentSpec.parse({**self.spec.dump(), **record["template"]})
        return None


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post about the ModelDeployment (what a plan asks; `Events` posts it)."""

    reason: str
    message: str
    warning: bool = False


def _plain(value: Any) -> Any:
    """A deep copy of a body fragment as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
