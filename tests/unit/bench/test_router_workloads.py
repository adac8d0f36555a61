"""The router benchmark's workloads are data: what they promise in their comments is checked here."""

import random
import statistics

import pytest
from router_workloads import (
    MIXED_PROMPT_MEDIAN,
    MIXED_PROMPT_RANGE,
    OUTPUT_CAP,
    WORKLOADS,
    mixed_lengths_body,
    open_loop_seconds,
)

PREFIX_WORDS = 2  # "Conversation <number>." before the drawn words


def test_mixed_lengths_draws_unique_prompts_of_log_normal_length():
    rng = random.Random(7)
    bodies = [mixed_lengths_body(rng, i / 2000) for i in range(2000)]
    lengths = [len(body["prompt"].split()) - PREFIX_WORDS for body in bodies]
    assert len({body["prompt"] for body in bodies}) == len(bodies)  # nothing shared
    assert MIXED_PROMPT_RANGE[0] <= min(lengths) and max(lengths) <= MIXED_PROMPT_RANGE[1]
    assert abs(statistics.median(lengths) - MIXED_PROMPT_MEDIAN) < 0.1 * MIXED_PROMPT_MEDIAN
    # heavy-tailed: the longest tenth are several times the median, the shortest tenth a fraction of it
    deciles = statistics.quantiles(lengths, n=10)
    assert deciles[-1] > 3 * MIXED_PROMPT_MEDIAN and deciles[0] < MIXED_PROMPT_MEDIAN / 3


def test_mixed_lengths_lets_the_reply_end_by_itself_and_is_held_out():
    body = mixed_lengths_body(random.Random(1), 0.0)
    assert body["ignore_eos"] is False and body["max_tokens"] == OUTPUT_CAP
    assert not WORKLOADS["mixed_lengths"].tuning


def test_a_low_rate_workload_runs_long_enough_for_its_minimum_of_requests():
    assert open_loop_seconds(20.0, 45.0, 3, 600) == 15.0  # 900 requests in 45 s: the run's own length
    assert open_loop_seconds(4.0, 45.0, 3, 600) == 50.0  # 150 s in all for 600 requests at 4/s
    assert open_loop_seconds(4.0, 45.0, 3, 0) == 15.0
    with pytest.raises(ValueError, match="rate must be positive"):
        open_loop_seconds(0.0, 45.0, 3, 600)
