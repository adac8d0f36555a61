"""The chart's dashboards hold to Grafana's current dashboard JSON model (schemaVersion 39 and later: Grafana 11
and 12), as a provisioned or sidecar-loaded dashboard must: a Prometheus data source chosen through a `datasource`
template variable that every panel, query and query variable uses; unique panel ids; a grid position inside the
24-column grid; a unit on every panel that shows numbers; one refId per query of a panel.
(Their queries are run against a live Prometheus in tests/integration/test_dashboards_live.py.)"""

from __future__ import annotations

import pytest

from tests.dashboards import (
    all_panels,
    load_dashboards,
    parse_label_values,
    query_variables,
    regex_of,
    substitute,
)

DASHBOARDS = load_dashboards()
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}
# schemaVersion 36 made panel data sources objects ({type, uid}); 39 is what Grafana 11 and 12 write.
MIN_SCHEMA_VERSION = 39
GRID_COLUMNS = 24
NUMERIC_PANELS = {"timeseries", "stat", "gauge", "bargauge", "barchart"}


def test_every_dashboard_is_there():
    assert set(DASHBOARDS) == {"router", "operator", "autoscaler"}


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_header(name):
    dashboard = DASHBOARDS[name]
    assert isinstance(dashboard.get("schemaVersion"), int), f"{name}: no schemaVersion"
    assert dashboard["schemaVersion"] >= MIN_SCHEMA_VERSION, (
        f"{name}: schemaVersion {dashboard['schemaVersion']}"
    )
    assert dashboard.get("uid") and len(dashboard["uid"]) <= 40, f"{name}: uid missing or over 40 characters"
    assert dashboard.get("title")
    assert "rows" not in dashboard, f"{name}: `rows` is the pre-5.0 layout; Grafana now reads `panels`"
    # provisioning assigns the numeric id; a fixed one clashes with the instance's own dashboards
    assert dashboard.get("id") is None, f"{name}: a fixed numeric id"


def test_uids_are_unique_across_dashboards():
    uids = [d["uid"] for d in DASHBOARDS.values()]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_datasource_variable_used_by_every_panel_query_and_variable(name):
    dashboard = DASHBOARDS[name]
    variables = dashboard.get("templating", {}).get("list", [])
    sources = [v for v in variables if v.get("type") == "datasource"]
    assert len(sources) == 1, f"{name}: needs exactly one datasource variable"
    assert sources[0]["name"] == "datasource" and sources[0]["query"] == "prometheus"
    for variable in query_variables(dashboard):
        assert variable.get("datasource") == DATASOURCE_REF, f"{name}: variable {variable['name']}"
    for panel in all_panels(dashboard):
        if panel.get("type") == "row":
            continue
        assert panel.get("datasource") == DATASOURCE_REF, f"{name}: panel {panel.get('title')!r}"
        for target in panel.get("targets", []):
            # a query without its own data source uses the panel's; one with its own must name the variable
            assert target.get("datasource", DATASOURCE_REF) == DATASOURCE_REF, (
                f"{name}: panel {panel.get('title')!r} query {target.get('refId')}"
            )


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_have_unique_ids_grid_positions_units_and_ref_ids(name):
    panels = all_panels(DASHBOARDS[name])
    assert panels, f"{name}: no panels"
    ids = [p.get("id") for p in panels]
    assert all(isinstance(i, int) and i > 0 for i in ids), f"{name}: panel ids {ids}"
    assert len(ids) == len(set(ids)), (
        f"{name}: duplicate panel ids {sorted(i for i in ids if ids.count(i) > 1)}"
    )
    for panel in panels:
        where = f"{name}: panel {panel['id']} {panel.get('title')!r}"
        grid = panel.get("gridPos") or {}
        assert {"x", "y", "w", "h"} <= grid.keys(), f"{where}: gridPos {grid}"
        assert 0 <= grid["x"] and grid["w"] > 0 and grid["x"] + grid["w"] <= GRID_COLUMNS, f"{where}: {grid}"
        if panel.get("type") == "row":
            continue
        assert panel.get("title"), f"{where}: no title"
        if panel.get("type") in NUMERIC_PANELS:
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
            assert unit, f"{where}: no unit (fieldConfig.defaults.unit)"
        targets = panel.get("targets", [])
        assert targets and all(t.get("expr") for t in targets), f"{where}: a query without an expression"
        ref_ids = [t.get("refId") for t in targets]
        assert all(ref_ids) and len(ref_ids) == len(set(ref_ids)), f"{where}: refIds {ref_ids}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_variable_a_query_uses_is_defined_before_use(name):
    dashboard = DASHBOARDS[name]
    defined: dict[str, str] = {"datasource": "prometheus"}
    for variable in query_variables(dashboard):
        selector, _ = parse_label_values(variable["query"])
        substitute(selector or "", defined, {})  # a variable may use only those defined above it
        defined[variable["name"]] = ".*"
    builtins = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            substitute(target["expr"], defined, builtins)  # KeyError names an undefined variable


def test_substitute_formats_variables_as_grafana_does():
    assert substitute(
        'x{a=~"$a", b="${b}"}[$__rate_interval]', {"a": "(p|q)", "b": "v"}, {"__rate_interval": "4s"}
    ) == ('x{a=~"(p|q)", b="v"}[4s]')
    with pytest.raises(KeyError, match="missing"):
        substitute('x{a=~"$missing"}', {}, {})
    assert parse_label_values('label_values(m{ns=~"$ns"}, model)') == ('m{ns=~"$ns"}', "model")
    assert parse_label_values("label_values(model)") == (None, "model")
    # as Grafana writes a multi-value variable into PromQL text: `\\.` in the string literal is the regex `\.`
    assert regex_of(["meta-llama/Llama-3.1-8B"]) == r"meta-llama/Llama-3\\.1-8B"
    assert regex_of(["a", "b(c)"]) == r"(a|b\\(c\\))"
