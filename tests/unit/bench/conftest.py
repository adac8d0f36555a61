"""The benchmarks are scripts run from `bench/` (`python bench/bench_x.py`), so they import their siblings
(`results_io`, `router_workloads`, ...) as top-level modules; the tests load them the same way."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
