"""GPUs promised to pods that were just created but that the pod index has not shown yet.

Between the create call and the watch event that puts a pod into Kopf's index, its GPUs look free; two
reconciles in a row (of one deployment or of two) would plan them twice. The ledger counts them as used until
the pod shows up in the index, or until the reservation expires (a pod whose create was refused, or that was
deleted before it was ever seen, must not hold its GPUs for ever).

Pure bookkeeping: the caller gives the time, so tests and simulations run it at any speed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_EXPIRY_SECONDS = 60.0


@dataclass(frozen=True)
class Reservation:
    node: str
    gpus: int
    reserved_at: float


@dataclass(frozen=True)
class NodeUse:
    """What the reservations add to one node: GPUs, and pods (best fit prefers the busier of two equal nodes)."""

    gpus: int = 0
    pods: int = 0


class GpuLedger:
    """Reservations keyed by pod ("namespace/name", the key the pod index uses)."""

    def __init__(self, expiry_seconds: float = DEFAULT_EXPIRY_SECONDS) -> None:
        self.expiry_seconds = expiry_seconds
        self._reservations: dict[str, Reservation] = {}

    def reserve(self, pod: str, node: str, gpus: int, now: float) -> None:
        self._reservations[pod] = Reservation(node, gpus, now)

    def release(self, pod: str) -> None:
        self._reservations.pop(pod, None)

    def used_by_node(self, seen_pods: Iterable[str], now: float) -> dict[str, NodeUse]:
        """GPUs and pods still reserved per node. Pods in `seen_pods` are counted by the index from now on, and
        expired reservations are for pods that will never be seen: both are dropped here, for good."""
        seen = set(seen_pods)
        for pod, reservation in list(self._reservations.items()):
            if pod in seen or now - reservation.reserved_at > self.expiry_seconds:
                del self._reservations[pod]
        use: dict[str, NodeUse] = {}
        for reservation in self._reservations.values():
            old = use.get(reservation.node, NodeUse())
            use[reservation.node] = NodeUse(old.gpus + reservation.gpus, old.pods + 1)
        return use

    def __len__(self) -> int:
        return len(self._reservations)

    def __contains__(self, pod: object) -> bool:
        return pod in self._reservations
