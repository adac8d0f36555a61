import random

import pytest
from tokenyard.router.core import Pipeline, pick_max
from tokenyard.router.framework import Filter, ReplicaSnapshot, RequestState, RoutingRequest, Scorer
from tokenyard.router.plugins.queue import QueueScorer


def snap(name, **kw):
    return ReplicaSnapshot(name=name, url=f"http://{name}", **kw)


def request(prompt_tokens=100, matches=None, **state):
    return RoutingRequest("m", prompt_tokens, 10, matches or {}, RequestState(**state))


def test_picker_breaks_ties_at_random_but_reproducibly():
    scores = [("b", 1.0), ("a", 1.0), ("c", 0.2)]
    picks = {pick_max(scores, random.Random(seed)) for seed in range(50)}
    assert picks == {"a", "b"}
    assert pick_max(scores, random.Random(7)) == pick_max(list(reversed(scores)), random.Random(7))
    assert pick_max([], random.Random()) is None


def test_registry_builds_by_name_and_rejects_unknown_names():
    assert isinstance(Scorer.build("queue"), QueueScorer)
    assert Filter.build("healthy").name == "healthy"
    with pytest.raises(ValueError, match="unknown scorer 'nope'"):
        Scorer.build("nope")
    with pytest.raises(ValueError, match="must be >= 0"):
        Pipeline.from_config({"queue": -1})


def test_pipeline_filters_unhealthy_ejected_and_other_revisions():
    pipeline = Pipeline.from_config({"outstandingTokens": 1})
    replicas = [
        snap("sick", healthy=False),
        snap("ejected", ejected=True),
        snap("old", revision="r1"),
        snap("new", revision="r2", outstanding_tokens=10_000),
    ]
    decision = pipeline.decide(request(revision="r2"), replicas, random.Random(0))
    assert decision.replica.name == "new"
    decision = pipeline.decide(request(revision="r3"), replicas, random.Random(0))
    assert decision.replica is None and "revision" in decision.reason


def test_pipeline_prefers_the_cached_replica_when_load_is_close():
    pipeline = Pipeline.from_config({"outstandingTokens": 1, "prefixCache": 1})
    replicas = [snap("a", outstanding_tokens=300), snap("b", outstanding_tokens=0)]
    decision = pipeline.decide(request(3000, {"a": 2900}), replicas, random.Random(0))
    assert decision.replica.name == "a"
    assert "prefixCache" in decision.breakdown
