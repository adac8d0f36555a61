"""The operator's process-wide state: settings, metrics, the analysis, the API writes (and the InferencePool
publisher), the wake-up events of the reconcile loops, the GPU ledger and the placement lock. One instance (`handlers.RUNTIME`), filled in at
start-up (`handlers.configure`) and handed to what applies the plans (`apply_plan`)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client as k8s
from tokenyard.operator.canary import PrometheusAnalysis
from tokenyard.operator.cluster_pods import PodGpuTable, TableOnceSynced, watch_pod_gpus
from tokenyard.operator.group_placement import CapacityWarnings
from tokenyard.operator.kube_writes import InferencePools, KubeWrites
from tokenyard.operator.ledger import GpuLedger
from tokenyard.operator.metrics import OperatorMetrics
from tokenyard.operator.placement import GroupShape
from tokenyard.operator.settings import OperatorSettings

log = logging.getLogger("tokenyard.operator")


class Runtime:
    """Until `start`: default settings, metrics on a registry of their own, an analysis without Prometheus
    (every look inconclusive), and no API client."""

    def __init__(self) -> None:
        self.settings = OperatorSettings()
        # `python -m tokenyard.operator` gives the metrics the registry its metrics server exposes.
        self.metrics = OperatorMetrics()
        self.analysis = PrometheusAnalysis(None)
        self.api: k8s.ApiClient | None = None
        self._writes: KubeWrites | None = None
        self._pools: InferencePools | None = None
        self.wakeups: dict[tuple[str, str], asyncio.Event] = {}
        # GPUs of pods created whose watch event has not reached the index yet: counted as used so that two
        # reconciles in a row never plan the same GPUs twice.
        self.ledger = GpuLedger()
        self.placement_lock = asyncio.Lock()
        self.capacity_warnings = CapacityWarnings()
        # (namespace, deployment) -> the shape of its groups: best fit protects, and stranded GPUs are measured
        # against, the shapes of every deployment this operator runs, not only the one reconciling.
        self.shapes: dict[tuple[str, str], GroupShape] = {}
        # Set by `python -m tokenyard.operator --namespace ...`: Kopf then watches pods only in those namespaces,
        # and the GPUs of every other namespace's pods come from a watch of our own (`cluster_pods`).
        self.namespaced = False
        self.cluster_pods: PodGpuTable | None = None
        self._cluster_pods_task: asyncio.Task | None = None
        # Set by `python -m tokenyard.operator`: the flag that stops Kopf, raised by `begin_stop` on SIGTERM,
        # and Kopf's settings (given to the start-up handler), which `begin_stop` shortens for the way out.
        self.stop_flag: asyncio.Event | None = None
        self.kopf_settings: Any = None

    def start(self, settings: OperatorSettings, api: k8s.ApiClient) -> None:
        self.settings = settings
        self.analysis = PrometheusAnalysis(settings.prometheus_url)
        self.api = api
        self._writes = KubeWrites(api)
        # Discovery is asked again once per resync interval: a CRD installed later is seen within one resync.
        self._pools = InferencePools(
            api,
            settings.endpoint_picker,
            recheck_seconds=settings.resync_seconds,
            enabled=settings.inference_pool != "off",
        )

    async def watch_cluster_pods(self, first_list_timeout: float) -> None:
        """Start the watch of every namespace's pods and wait (up to the timeout) for its first list."""
        assert self.api is not None
        self.cluster_pods = PodGpuTable()
        self._cluster_pods_task = asyncio.create_task(watch_pod_gpus(self.api, self.cluster_pods))
        await asyncio.wait_for(self.cluster_pods.synced.wait(), first_list_timeout)

    def take_over_signals(self) -> None:
        """SIGTERM and SIGINT call `begin_stop` instead of Kopf's own handler (which only raises its flag)."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.begin_stop, signum)

    def begin_stop(self, signum: int) -> None:
        """Stop the operator, and give whatever Kopf still asks of the API server on its way out (the peering's
        goodbye above all) one attempt of a few seconds instead of its usual nine of ten seconds each: with the
        API server hanging, a peered operator told to stop went on retrying its goodbye for over a minute.
        A peer that could not say goodbye is presumed gone after the peering lifetime, as after a SIGKILL."""
        if self.kopf_settings is not None:
            networking = self.kopf_settings.networking
            networking.request_timeout, networking.connect_timeout, networking.error_backoffs = (
                3.0,
                2.0,
                (1.0,),
            )
        log.info(f"{signal.Signals(signum).name} received: the operator is stopping")
        if self.stop_flag is not None:
            self.stop_flag.set()

    def pod_gpus_view(self, kopf_index: Mapping[str, Any]) -> Mapping[str, Any]:
        """The pod GPUs placement should count: every namespace's once our own watch has listed them, Kopf's
        index of the watched namespaces until then (an empty table would call every node free)."""
        if self.cluster_pods is None:
            return kopf_index
        return TableOnceSynced(self.cluster_pods, kopf_index)

    async def stop_watching_cluster_pods(self) -> None:
        """Stop the watch; called from Kopf's cleanup, so whatever the task died of is logged, never raised."""
        task, self._cluster_pods_task = self._cluster_pods_task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception as e:  # noqa: BLE001 - shutting down: say it, go on closing
            log.warning(f"the watch of every namespace's pods had failed: {e!r}")

    @property
    def writes(self) -> KubeWrites:
        if self._writes is None:
            raise RuntimeError("the operator has not started: no API client yet")
        return self._writes

    @property
    def pools(self) -> InferencePools:
        if self._pools is None:
            raise RuntimeError("the operator has not started: no API client yet")
        return self._pools

    def wakeup(self, key: tuple[str, str]) -> asyncio.Event:
        return self.wakeups.setdefault(key, asyncio.Event())

    def forget(self, key: tuple[str, str]) -> None:
        """A deployment's loop ended (deleted, or this replica stopped): drop its state and its series."""
        self.wakeups.pop(key, None)
        self.shapes.pop(key, None)
        self.metrics.forget_deployment(*key)
