from tokenyard.operator import metrics


def _samples(family):
    return [s for m in family.collect() for s in m.samples]


def test_forgetting_a_deployment_drops_only_its_series():
    metrics.PENDING_GROUPS.labels("ns", "gone", "InsufficientCapacity").set(1)
    metrics.PENDING_GROUPS.labels("ns", "kept", "InsufficientCapacity").set(1)
    metrics.ROLLOUT_WEIGHT.labels("ns", "gone", "abc").set(50)
    metrics.forget_deployment("ns", "gone")
    pending = {s.labels["deployment"] for s in _samples(metrics.PENDING_GROUPS)}
    assert "gone" not in pending and "kept" in pending
    assert all(s.labels["deployment"] != "gone" for s in _samples(metrics.ROLLOUT_WEIGHT))


def test_ttft_slo_is_read_from_an_existing_router_bucket():
    from tokenyard.operator.canary import _le

    assert _le(0.5) == "0.5"
    assert _le(0.3) == "0.25"  # no 0.3 bucket: the largest bound below it
    assert _le(0.001) == "0.005"
