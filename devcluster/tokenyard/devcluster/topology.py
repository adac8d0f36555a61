"""Fake GPU nodes from a topology description.

The default is 2 zones x 2 racks x 2 NVLink domains x 2 nodes x 8 GPUs: 16 nodes and 128 GPUs, small
enough for 2 cores and big enough that placement has choices at every level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenyard.core import labels

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"


@dataclass(frozen=True)
class Topology:
    zones: int = 2
    racks_per_zone: int = 2
    nvlink_domains_per_rack: int = 2
    nodes_per_nvlink_domain: int = 2
    gpus_per_node: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    cpu_per_node: str = "96"
    memory_per_node: str = "1Ti"
    pods_per_node: str = "110"

    @classmethod
    def parse(cls, text: str) -> Topology:
        """`2x2x2x2x8` = zones x racks per zone x NVLink domains per rack x nodes per domain x GPUs per node."""
        parts = text.lower().split("x")
        if len(parts) != 5 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(
                f"topology {text!r}: expected ZONESxRACKSxDOMAINSxNODESxGPUS with positive integers, e.g. 2x2x2x2x8"
            )
        z, r, d, n, g = map(int, parts)
        return cls(
            zones=z, racks_per_zone=r, nvlink_domains_per_rack=d, nodes_per_nvlink_domain=n, gpus_per_node=g
        )

    def describe(self) -> str:
        return (
            f"{self.zones}x{self.racks_per_zone}x{self.nvlink_domains_per_rack}x"
            f"{self.nodes_per_nvlink_domain}x{self.gpus_per_node}"
        )

    def nodes(self) -> list[dict[str, Any]]:
        """The Node objects, without status (the status is written through the status subresource)."""
        out = []
        for z in range(self.zones):
            zone = f"zone-{chr(ord('a') + z)}"
            for r in range(self.racks_per_zone):
                rack = f"{zone}-rack-{r}"
                for d in range(self.nvlink_domains_per_rack):
                    domain = f"{rack}-nvl-{d}"
                    for n in range(self.nodes_per_nvlink_domain):
                        out.append(self.node(f"gpu-{domain}-{n}", zone, rack, domain))
        return out

    def node(self, name: str, zone: str, rack: str, domain: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    labels.NODE_ZONE: zone,
                    labels.NODE_RACK: rack,
                    labels.NODE_NVLINK_DOMAIN: domain,
                    labels.NODE_GPU_PRODUCT: self.gpu_product,
                },
            },
            "spec": {},
        }

    def node_status(self) -> dict[str, Any]:
        resources = {
            "cpu": self.cpu_per_node,
            "memory": self.memory_per_node,
            "pods": self.pods_per_node,
            labels.GPU_RESOURCE: str(self.gpus_per_node),
        }
        return {"status": {"capacity": resources, "allocatable": resources}}
