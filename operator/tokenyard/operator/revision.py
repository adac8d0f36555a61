"""Revision hashing: which changes of a ModelDeployment restart its engines.

A revision covers what an engine process is made of: the model artifact identity (weights and tokenizer URI
and digest, the served name), the engine container (image, args, env, port, resources, pod template) and the
parallelism. It does not cover `replicas`, placement hints, routing weights or the rollout strategy: changing
those restarts nothing.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tokenyard.core.types import ModelDeploymentSpec

REVISION_LENGTH = 10  # hex characters: enough to never collide within one deployment's history


def revision_template(spec: ModelDeploymentSpec) -> dict[str, Any]:
    """The part of the spec a revision is made of (also what `undo` restores)."""
    return {
        "model": spec.model.dump(),
        "engine": spec.engine.dump(),
        "parallelism": spec.parallelism.dump(),
    }


def revision_hash(spec: ModelDeploymentSpec) -> str:
    canonical = json.dumps(revision_template(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_LENGTH]
