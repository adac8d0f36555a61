"""The chart's Grafana dashboards as data: their panels' queries and template variables, and Grafana's substitution
of those variables, for the structure test (unit) and the live-Prometheus test (integration)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "charts" / "tokenyard" / "dashboards"


def load_dashboards() -> dict[str, dict]:
    """Every dashboard JSON of the chart by file stem (router, operator, autoscaler)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))}


def all_panels(dashboard: dict) -> list[dict]:
    """Every panel, including those nested in collapsed rows."""
    found = []
    for panel in dashboard.get("panels", []):
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel_id: int
    title: str
    ref_id: str
    expr: str

    @property
    def name(self) -> str:
        return f"{self.dashboard}#{self.panel_id}{self.ref_id} {self.title}"


def panel_queries(dashboards: dict[str, dict]) -> list[PanelQuery]:
    return [
        PanelQuery(name, panel["id"], panel.get("title", ""), target.get("refId", ""), target["expr"])
        for name, dashboard in dashboards.items()
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def query_variables(dashboard: dict) -> list[dict]:
    """The dashboard's `query` template variables, in order (a later one may use an earlier one)."""
    return [v for v in dashboard.get("templating", {}).get("list", []) if v.get("type") == "query"]


LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<selector>.+),\s*)?(?P<label>[a-zA-Z_]\w*)\s*\)\s*$")


def parse_label_values(query: str) -> tuple[str | None, str]:
    """(series selector or None, label) of Grafana's `label_values(selector, label)` variable query."""
    match = LABEL_VALUES.match(query if isinstance(query, str) else query.get("query", ""))
    if not match:
        raise ValueError(f"not a label_values(...) query: {query!r}")
    return match["selector"], match["label"]


def regex_of(values: list[str]) -> str:
    r"""A multi-value variable as Grafana's Prometheus data source writes it into a query: each value regex-escaped
    with the backslashes doubled (the query is PromQL text, where a string literal needs `\\.` to mean `\.`), and
    several values as one alternation (prometheusSpecialRegexEscape and interpolateQueryExpr in Grafana's
    datasource.ts)."""
    escaped = [
        re.sub(r"([$^*{}\[\]'+?.()|])", r"\\\\\1", value.replace("\\", "\\\\\\\\")) for value in values
    ]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, variables: dict[str, str], builtins: dict[str, str]) -> str:
    """`expr` with $name, ${name} and [[name]] replaced by `variables`, and Grafana's $__ built-ins by `builtins`
    (for example `__rate_interval`); an unknown variable raises KeyError naming it."""
    values = {**variables, **builtins}

    def one(match: re.Match) -> str:
        name = match["braced"] or match["plain"] or match["old"]
        if name not in values:
            raise KeyError(f"{name} (in {expr!r})")
        return values[name]

    return re.sub(r"\$\{(?P<braced>\w+)(?::\w+)?\}|\$(?P<plain>\w+)|\[\[(?P<old>\w+)\]\]", one, expr)
