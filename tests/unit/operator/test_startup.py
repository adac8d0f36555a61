"""The operator's handlers module has no side effect at import: the rollout analysis is built at start-up."""

import os
import subprocess
import sys
import textwrap


def test_the_analysis_is_built_from_the_setting_at_startup_not_at_import():
    script = textwrap.dedent(
        """
        import os
        os.environ["TOKENYARD_PROMETHEUS_URL"] = "http://prometheus:9090"
        from tokenyard.operator import handlers
        assert not hasattr(handlers, "ANALYSIS")
        assert handlers.RUNTIME.analysis.url is None  # the import read no setting
        assert handlers.analysis_from_environment().url == "http://prometheus:9090"
        del os.environ["TOKENYARD_PROMETHEUS_URL"]
        assert handlers.analysis_from_environment().url is None
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TOKENYARD_PROMETHEUS_URL"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
