"""tokenyard autoscaler: scales replica groups from queue depth, KV-cache occupancy and TTFT read from
Prometheus. The decision core is :mod:`tokenyard.autoscaler.policy`; the rest are adapters."""
