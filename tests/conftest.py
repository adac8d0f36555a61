"""Session-wide test configuration; integration fixtures live in tests/integration/conftest.py."""

import os

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI a skip is a failure: CI installs every prerequisite (helm, Prometheus, redis-server, the
    sglang-router package), so a test that skips there has lost what it checks without anyone noticing."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every prerequisite must be installed: {report.longrepr}"
