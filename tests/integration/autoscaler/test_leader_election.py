"""Two autoscaler replicas electing a leader through a real coordination.k8s.io Lease: the API server's
optimistic concurrency (a stale resourceVersion gets 409) is what keeps them from both writing."""

from __future__ import annotations

import asyncio
import time

import pytest
from kubernetes_asyncio import client as aclient
from kubernetes_asyncio import config as aconfig
from tokenyard.autoscaler.controller import LeaseElector

pytestmark = pytest.mark.integration

LEASE_SECONDS = 2


async def test_one_replica_leads_at_a_time_and_a_silent_leader_is_replaced(devcluster, namespace):
    api_client = await aconfig.new_client_from_config(config_file=str(devcluster.kubeconfig))
    try:
        api = aclient.CoordinationV1Api(api_client)
        first = LeaseElector(api, namespace, identity="replica-a", lease_seconds=LEASE_SECONDS)
        second = LeaseElector(api, namespace, identity="replica-b", lease_seconds=LEASE_SECONDS)

        # Both ask at the same moment, round after round: the server lets exactly one write win each time.
        for _ in range(10):
            outcomes = await asyncio.gather(first.ensure_leader(), second.ensure_leader())
            assert sorted(outcomes) == [False, True]
        leader, follower = (first, second) if first.is_leader else (second, first)

        # The leader goes silent (killed without releasing): the follower waits out the lease, then takes it.
        last_renewal = time.monotonic()
        assert await follower.ensure_leader() is False
        while not await follower.ensure_leader():
            assert time.monotonic() - last_renewal < LEASE_SECONDS + 10, (
                "the follower never took the lease over"
            )
            await asyncio.sleep(0.2)
        assert time.monotonic() - last_renewal >= LEASE_SECONDS * 0.9  # not before the lease ran out
        assert await leader.ensure_leader() is False
        lease = await api.read_namespaced_lease("tokenyard-autoscaler", namespace)
        assert lease.spec.holder_identity == follower.identity
        assert lease.spec.lease_transitions == 1

        # A clean stop hands the lease over at once.
        await follower.release()
        assert await leader.ensure_leader() is True
    finally:
        await api_client.close()
