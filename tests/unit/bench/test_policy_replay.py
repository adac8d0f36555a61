"""bench/policy_replay.py: placement alone, in modelled time."""

import policy_replay


def test_every_request_gets_a_first_token_and_the_two_placements_are_alike_on_equal_prompts():
    robin = policy_replay.replay("round_robin", rate=40.0, seconds=20.0)
    scored = policy_replay.replay("load_score", rate=40.0, seconds=20.0)
    assert len(robin) == len(scored) > 600  # the same arrivals, every one answered
    assert all(t > 0 for t in robin + scored)
    p99 = [policy_replay.percentile(ttfts, 0.99) for ttfts in (robin, scored)]
    assert abs(p99[1] / p99[0] - 1) < 0.1, p99
