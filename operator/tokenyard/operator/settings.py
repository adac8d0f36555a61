"""The operator's settings, read once when the operator starts (Kopf's start-up handler), never at import.

`python -m tokenyard.operator` puts its command-line settings in the environment (the Helm chart sets the
rest there), and `OperatorSettings.from_environment` reads them all in one place.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokenyard.operator.manifests import EPP_FAILURE_MODES, EndpointPicker

RESYNC = "TOKENYARD_RESYNC_SECONDS"
BIND_TIMEOUT = "TOKENYARD_BIND_TIMEOUT_SECONDS"
PEERING_LIFETIME = "TOKENYARD_PEERING_LIFETIME_SECONDS"
PROMETHEUS_URL = "TOKENYARD_PROMETHEUS_URL"
KUBECONFIG = "KUBECONFIG"
INFERENCE_POOL = "TOKENYARD_INFERENCE_POOL"
EPP_SERVICE = "TOKENYARD_EPP_SERVICE"
EPP_PORT = "TOKENYARD_EPP_PORT"
EPP_FAILURE_MODE = "TOKENYARD_EPP_FAILURE_MODE"
INFERENCE_POOL_MODES = ("auto", "off")


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
    # "auto": publish an InferencePool per ModelDeployment whenever the API server serves that API; "off": never.
    inference_pool: str = "auto"
    # The endpoint picker the pools name (tokenyard's router Service and its EPP port).
    endpoint_picker: EndpointPicker = field(default_factory=EndpointPicker)

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
            inference_pool=_choice(environ, INFERENCE_POOL, INFERENCE_POOL_MODES, defaults.inference_pool),
            endpoint_picker=_endpoint_picker(environ, defaults.endpoint_picker),
        )


def _choice(environ: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str) -> str:
    raw = environ.get(name)
    if not raw:
        return default
    if raw not in allowed:
        raise SettingError(f"{name}={raw!r}: must be one of {', '.join(allowed)}")
    return raw


def _endpoint_picker(environ: Mapping[str, str], default: EndpointPicker) -> EndpointPicker:
    service = environ.get(EPP_SERVICE) or default.service
    # A Service name is a DNS label (RFC 1035): the API server would refuse every pool naming another.
    if len(service) > 63 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", service):
        raise SettingError(f"{EPP_SERVICE}={service!r}: not a Service name (lowercase DNS label)")
    raw_port = environ.get(EPP_PORT)
    port = default.port
    if raw_port:
        if not raw_port.isdigit() or not 1 <= int(raw_port) <= 65535:
            raise SettingError(f"{EPP_PORT}={raw_port!r}: not a port number (1-65535)")
        port = int(raw_port)
    failure_mode = _choice(environ, EPP_FAILURE_MODE, EPP_FAILURE_MODES, default.failure_mode)
    return EndpointPicker(service, port, failure_mode)


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
