"""The operator's settings, read once when the operator starts (Kopf's start-up handler), never at import.

`python -m tokenyard.operator` puts its command-line settings in the environment (the Helm chart sets the
rest there), and `OperatorSettings.from_environment` reads them all in one place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

RESYNC = "TOKENYARD_RESYNC_SECONDS"
BIND_TIMEOUT = "TOKENYARD_BIND_TIMEOUT_SECONDS"
PEERING_LIFETIME = "TOKENYARD_PEERING_LIFETIME_SECONDS"
PROMETHEUS_URL = "TOKENYARD_PROMETHEUS_URL"
KUBECONFIG = "KUBECONFIG"


class SettingError(ValueError):
    """A setting that cannot be used; the message names the variable."""


@dataclass(frozen=True)
class OperatorSettings:
    # Seconds between two level-based resyncs of one ModelDeployment (a pod change wakes it sooner).
    resync_seconds: float = 10.0
    # Seconds a group's pods may stay unbound before the group is re-planned whole.
    bind_timeout_seconds: float = 30.0
    # How long a replica that died without saying goodbye (kill -9, a lost node) blocks its standby peers.
    peering_lifetime_seconds: int = 60
    # Prometheus for the rollout analysis; without it every analysis is inconclusive.
    prometheus_url: str | None = None
    # The kubeconfig to use; None: the in-cluster configuration.
    kubeconfig: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> OperatorSettings:
        """The settings from `environ` (unset or empty variables keep their defaults). Raises SettingError."""
        defaults = cls()
        return cls(
            resync_seconds=_seconds(environ, RESYNC, defaults.resync_seconds),
            bind_timeout_seconds=_seconds(environ, BIND_TIMEOUT, defaults.bind_timeout_seconds),
            peering_lifetime_seconds=int(
                _seconds(environ, PEERING_LIFETIME, defaults.peering_lifetime_seconds)
            ),
            prometheus_url=environ.get(PROMETHEUS_URL) or None,
            kubeconfig=environ.get(KUBECONFIG) or None,
        )


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise SettingError(f"{name}={raw!r}: must be a positive number of seconds")
    return value
