"""Metric facts more than one component depends on."""

# Bucket bounds (seconds) of the router's latency histograms. The operator's rollout analysis reads the share
# of requests over a TTFT SLO from these buckets, so it must know which bounds exist.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def bucket_at_or_below(seconds: float) -> float:
    """The largest latency bucket bound not above `seconds` (the smallest bound when all are above): the
    share over that bound is what a histogram can say about an SLO of `seconds`."""
    below = [b for b in LATENCY_BUCKETS_S if b <= seconds]
    return float(below[-1] if below else LATENCY_BUCKETS_S[0])
