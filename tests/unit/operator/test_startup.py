"""The operator's handlers module has no side effect at import: its settings are read at start-up."""

import os
import subprocess
import sys
import textwrap

import pytest
from tokenyard.operator.settings import OperatorSettings, SettingError


def test_importing_the_handlers_reads_no_setting():
    script = textwrap.dedent(
        """
        import os
        os.environ["TOKENYARD_PROMETHEUS_URL"] = "http://prometheus:9090"
        os.environ["TOKENYARD_RESYNC_SECONDS"] = "not a number"  # would fail if read at import
        from tokenyard.operator import handlers
        from tokenyard.operator.settings import OperatorSettings
        assert not hasattr(handlers, "ANALYSIS") and not hasattr(handlers, "RESYNC_SECONDS")
        assert handlers.RUNTIME.settings == OperatorSettings()
        assert handlers.RUNTIME.analysis.url is None  # the import read no setting
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TOKENYARD_PROMETHEUS_URL"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_settings_come_from_the_environment():
    settings = OperatorSettings.from_environment(
        {
            "TOKENYARD_RESYNC_SECONDS": "2",
            "TOKENYARD_BIND_TIMEOUT_SECONDS": "5.5",
            "TOKENYARD_PEERING_LIFETIME_SECONDS": "30",
            "TOKENYARD_PROMETHEUS_URL": "http://prometheus:9090",
            "KUBECONFIG": "/tmp/kubeconfig",
        }
    )
    assert settings == OperatorSettings(2.0, 5.5, 30, "http://prometheus:9090", "/tmp/kubeconfig")


def test_unset_or_empty_settings_keep_their_defaults():
    assert OperatorSettings.from_environment({}) == OperatorSettings()
    empty = OperatorSettings.from_environment(
        {"TOKENYARD_PROMETHEUS_URL": "", "TOKENYARD_RESYNC_SECONDS": ""}
    )
    assert empty.prometheus_url is None and empty.resync_seconds == 10.0


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf"])
def test_a_bad_setting_is_refused_with_its_name(value):
    with pytest.raises(SettingError, match="TOKENYARD_BIND_TIMEOUT_SECONDS"):
        OperatorSettings.from_environment({"TOKENYARD_BIND_TIMEOUT_SECONDS": value})


def test_the_command_line_refuses_a_bad_setting_in_one_line(monkeypatch, capsys):
    from tokenyard.operator.__main__ import parse_args

    monkeypatch.setenv("TOKENYARD_RESYNC_SECONDS", "abc")
    with pytest.raises(SystemExit) as exit:
        parse_args([])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "python -m tokenyard.operator: error: TOKENYARD_RESYNC_SECONDS='abc': not a number of seconds"
    ]
