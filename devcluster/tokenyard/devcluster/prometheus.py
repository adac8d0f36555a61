"""A real Prometheus for the local stack (`make demo` and the integration tests), scraping what the chart says.

The scrape configuration is not written here: it is the chart's own plain-Prometheus configuration
(charts/tokenyard/templates/prometheus-scrape-config.yaml), rendered by `helm template`, so the demo, the tests and
a user of a plain Prometheus scrape the same targets with the same labels. The only local change is how Prometheus
reaches the API server: from outside the cluster, with the admin token (`out_of_cluster`).
"""

from __future__ import annotations

import copy
import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from tokenyard.core.process import ManagedProcess

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "tokenyard"
SCRAPE_TEMPLATE = "templates/prometheus-scrape-config.yaml"
SCRAPE_FILE_KEY = "tokenyard-scrape-configs.yml"
RELEASE = "tokenyard"


class PrometheusError(RuntimeError):
    """Prometheus could not be configured, started or queried."""


def chart_scrape_configs(
    helm: Path, namespace: str, interval: str = "15s", release: str = RELEASE, chart: Path = CHART
) -> list[dict]:
    """The chart's plain-Prometheus `scrape_configs` for a release named `release` in `namespace`."""
    command = [
        str(helm),
        "template",
        release,
        str(chart),
        f"--namespace={namespace}",
        f"--show-only={SCRAPE_TEMPLATE}",
        "--set=prometheusScrapeConfig.enabled=true",
        f"--set=prometheusScrapeConfig.interval={interval}",
        # a scrape may not take longer than its interval
        f"--set=prometheusScrapeConfig.scrapeTimeout={interval}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise PrometheusError(f"helm template {SCRAPE_TEMPLATE} failed: {result.stderr.strip()}")
    config_map = yaml.safe_load(result.stdout)
    return yaml.safe_load(config_map["data"][SCRAPE_FILE_KEY])["scrape_configs"]


def out_of_cluster(scrape_configs: list[dict], api_server: str, token: str) -> list[dict]:
    """`scrape_configs` for a Prometheus that runs outside the cluster: every Kubernetes service discovery talks
    to `api_server` with `token` (the local API server's certificate is self-signed) instead of the in-cluster
    service account."""
    adapted = copy.deepcopy(scrape_configs)
    for job in adapted:
        for discovery in job.get("kubernetes_sd_configs", []):
            discovery["api_server"] = api_server
            discovery["tls_config"] = {"insecure_skip_verify": True}
            discovery["authorization"] = {"credentials": token}
    return adapted


def prometheus_config(scrape_configs: list[dict], interval: str) -> dict:
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": scrape_configs,
    }


def prometheus_process(binary: Path, folder: Path, scrape_configs: list[dict], port: int) -> ManagedProcess:
    """A Prometheus on 127.0.0.1:`port` scraping every second, its data and log in `folder` (not yet started)."""
    config = folder / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(scrape_configs, "1s"), sort_keys=False))
    return ManagedProcess(
        [
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        folder / "prometheus.log",
        program=[str(binary)],
    )


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def query(url: str, expr: str, timeout: float = 10) -> list[dict]:
    """The instant-query result of `expr` (a list of series; empty when there is no data). A query Prometheus
    refuses raises PrometheusError with its message."""
    return _api(url, "query", {"query": expr}, timeout)


def query_range(
    url: str, expr: str, start: float, end: float, step_s: float, timeout: float = 30
) -> list[dict]:
    """The range-query result of `expr` from `start` to `end` (Unix seconds), as a dashboard panel asks for it."""
    return _api(url, "query_range", {"query": expr, "start": start, "end": end, "step": step_s}, timeout)


def _api(url: str, endpoint: str, params: dict, timeout: float) -> list[dict]:
    address = f"{url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(address, timeout=timeout) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as e:  # 400 for a bad expression, with the reason in the body
        body = json.loads(e.read() or b"{}")
    if body.get("status") != "success":
        raise PrometheusError(f"{params['query']!r}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def active_targets(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=10) as response:
        return json.loads(response.read())["data"]["activeTargets"]
