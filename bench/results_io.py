"""Where every benchmark leaves its figures for bench/report.py: one JSON file per benchmark.

``write_results(name, payload)`` writes ``<results dir>/<name>.json``: the benchmark's final JSON object (the
one it prints last) plus a ``run`` record of what shaped it -- the UTC date, the git commit (and whether the
working tree had uncommitted changes) and every ``BENCH_*`` environment variable. The results directory is
``BENCH_RESULTS_DIR`` when set (a quick run written elsewhere does not overwrite the official figures),
``bench/results`` otherwise.

A benchmark whose figures come in parts, each measured side by side within itself (bench-router's workloads:
every policy of a workload runs in the same rounds), may write each part as it is done and keep the parts of an
earlier file that this run did not measure (``merge_parts``), each part with the record of the run that measured
it. A long run stopped half way then loses nothing it finished, and a results file can be brought up to date
part by part without ever comparing figures of two runs with each other.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS_DIR = REPO / "bench" / "results"
RESULTS_DIR_VARIABLE = "BENCH_RESULTS_DIR"


def results_dir(environ: Mapping[str, str] = os.environ) -> Path:
    configured = environ.get(RESULTS_DIR_VARIABLE, "")
    return Path(configured) if configured else DEFAULT_RESULTS_DIR


def _git(*args: str) -> str | None:
    """One git command's output in the repository, or None when git or the repository is not there (a
    benchmark run from an unpacked tarball still writes its figures)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def run_record(environ: Mapping[str, str] = os.environ, now: datetime.datetime | None = None) -> dict:
    """What a reader needs to reproduce the run: when, from which commit, with which BENCH_* settings."""
    now = now or datetime.datetime.now(datetime.UTC)
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted_changes": None if status is None else bool(status),
        # the settings that shaped the run; where its results went did not
        "environment": {
            key: value
            for key, value in sorted(environ.items())
            if key.startswith("BENCH_") and key != RESULTS_DIR_VARIABLE
        },
    }


PARTS_RUNS = "part_runs"  # part name -> run record of the run that measured it


def read_results(name: str) -> dict | None:
    """The results file ``<results dir>/<name>.json`` as it is, or None when there is none."""
    path = results_dir() / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def merge_parts(previous: Mapping | None, payload: Mapping, measured: Mapping[str, Mapping]) -> dict:
    """``payload`` (its ``results`` keyed by part, ``measured`` the run record of each part this run measured)
    with every part of ``previous`` that this run did not measure, carried with the record of the run that
    measured it (its own ``part_runs`` entry, else the whole file's ``run``). Parts measured now replace theirs.
    Pure: the caller reads and writes the files."""
    results = dict(payload.get("results", {}))
    runs = {part: dict(record) for part, record in measured.items()}
    if previous:
        old_runs = previous.get(PARTS_RUNS) or {}
        for part, figures in (previous.get("results") or {}).items():
            if part in results:
                continue
            results[part] = figures
            record = old_runs.get(part) or previous.get("run")
            if record is not None:
                runs[part] = record
    return {**payload, "results": results, PARTS_RUNS: runs}


def write_results(name: str, payload: Mapping) -> Path:
    """Write ``payload`` with its run record to ``<results dir>/<name>.json`` and return the path. The file is
    replaced whole (written beside it, then renamed), so a report never reads half a result."""
    if "run" in payload:
        raise ValueError(
            f"{name}: the payload already has a 'run' key; write_results adds that record itself"
        )
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps({**payload, "run": run_record()}, indent=1) + "\n")
    partial.replace(path)
    # stderr: a benchmark's last line on stdout stays its JSON object.
    print(f"results written to {path}", file=sys.stderr)
    return path
