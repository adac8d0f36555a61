"""The router benchmark's workloads are data: what they promise in their comments is checked here."""

import random
import statistics

from router_workloads import (
    MIXED_PROMPT_MEDIAN,
    MIXED_PROMPT_RANGE,
    OUTPUT_CAP,
    WORKLOADS,
    mixed_lengths_body,
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
