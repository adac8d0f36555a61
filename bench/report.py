"""The benchmarks' results as one page: a markdown table per benchmark and the plots a reader would rather see.

Reads ``<results dir>/<bench>.json`` (written by each benchmark through bench/results_io.py) for whichever
benchmarks have run, and writes into the same directory:

- ``RESULTS.md``: per benchmark its headline figures and the ratios against tokenyard, tokenyard's shipped row
  first, oracle / tuned / documented rows labelled as such, and the commit, date and BENCH_* settings of the run;
  a benchmark without a results file is listed as not run;
- ``router_ttft_cdf_<workload>.png``: the open-loop TTFT CDF of every router policy, per workload;
- ``autoscaler_slo_vs_gpu_hours.png``: SLO attainment against GPU-hours, one point per policy row, the floor
  the tuning aims at as a line;
- ``rollout_false_rollback_vs_detection.png``: false-rollback rate against the canary requests needed to
  catch a 2x regression, one point per rule (tokenyard's at every alpha as a line);
- ``placement_stranded_vs_load.png``: mean stranded GPUs against offered load, one line per strategy.

Usage: ``python bench/report.py [--results-dir DIR]`` (default: ``BENCH_RESULTS_DIR`` or bench/results).
Exits 1, after writing everything it can, when a results file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a build machine
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import results_dir  # noqa: E402

# In the order of `make bench`, each with the target that writes its results.
BENCHES = {
    "sim": "bench-sim",
    "router": "bench-router",
    "placement": "bench-placement",
    "autoscaler": "bench-autoscaler",
    "rollout": "bench-rollout",
    "operator_cluster": "bench-operator-cluster",
}
REPORT_NAME = "RESULTS.md"
ROUTER_PLOT = "router_ttft_cdf_{workload}.png"
AUTOSCALER_PLOT = "autoscaler_slo_vs_gpu_hours.png"
ROLLOUT_PLOT = "rollout_false_rollback_vs_detection.png"
PLACEMENT_PLOT = "placement_stranded_vs_load.png"
PLOT_PATTERNS = (ROUTER_PLOT.format(workload="*"), AUTOSCALER_PLOT, ROLLOUT_PLOT, PLACEMENT_PLOT)
SHIPPED = "tokenyard"
OURS_COLOUR = "tab:red"  # tokenyard's shipped row in every plot; the peers take the other colours in turn
PEER_COLOURS = (
    "tab:blue",
    "tab:green",
    "tab:orange",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:gray",
    "tab:olive",
)


@dataclass
class Section:
    """One benchmark's part of the page: markdown blocks and the plots written for it."""

    blocks: list[str] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)

    def add_plot(self, path: Path) -> None:
        """The plot, shown where it is added (under the table it draws)."""
        self.plots.append(path)
        self.blocks.append(f"![{path.stem}]({path.name})")


# --- formatting -------------------------------------------------------------------------------------------------


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def fmt(value: object, digits: int = 3, percent: bool = False) -> str:
    """A figure for a table cell: '-' when the result does not have it."""
    if not is_number(value):
        return "-" if value is None else str(value)
    return f"{value * 100:.{digits}f}%" if percent else f"{value:,.{digits}f}"


def with_se(entry: dict, key: str, digits: int = 3, percent: bool = False) -> str:
    text = fmt(entry.get(key), digits, percent)
    se = entry.get(f"{key}_se")
    return f"{text} ± {fmt(se, digits, percent)}" if is_number(se) and text != "-" else text


def ratio(numerator: object, denominator: object, digits: int = 2) -> str:
    """numerator / denominator as a table cell ('-' when either is missing or the denominator is 0)."""
    if not (is_number(numerator) and is_number(denominator)) or denominator == 0:
        return "-"
    return f"{numerator / denominator:.{digits}f}"


def table(header: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def shipped_first(names: Iterable[str]) -> list[str]:
    names = list(names)
    return [name for name in names if name == SHIPPED] + [name for name in names if name != SHIPPED]


def run_line(payload: dict) -> str:
    """The commit, date and settings of a result, or a plain statement that the file does not record them."""
    run = payload.get("run")
    if not isinstance(run, dict):
        return "Run: not recorded (a results file written before bench/results_io.py)."
    commit = f"commit `{run['commit']}`" if run.get("commit") else "commit unknown"
    if run.get("uncommitted_changes"):
        commit += " with uncommitted changes"
    settings = ", ".join(f"`{k}={v}`" for k, v in (run.get("environment") or {}).items()) or "defaults"
    return f"Run: {run.get('date', 'undated')}, {commit}, settings: {settings}."


# --- router -------------------------------------------------------------------------------------------------------


# dispatched by the load generator itself, straight to the engines (bench_router.py's docstring)
IDEAL_BALANCERS = ("round_robin", "least_outstanding")


def router_kind(policy: str, payload: dict) -> str:
    if policy == SHIPPED:
        return "shipped"
    if policy in payload.get("tokenyard_variants", []):
        return "tokenyard variant (extra)"
    if policy in payload.get("tuned_peers", []):
        return "peer, tuned"
    if policy.endswith(":defaults"):
        return "peer, defaults"
    if policy in IDEAL_BALANCERS:
        return "peer, ideal (no proxy hop)"
    if policy.endswith(":round_robin"):
        return "peer, round robin through its proxy"
    return "peer"


def part_line(payload: dict, part: str) -> str:
    """Which run measured one part of a file written part by part (results_io.merge_parts); "" for a file
    written whole, whose run line says it all."""
    record = (payload.get("part_runs") or {}).get(part)
    if not isinstance(record, dict):
        return ""
    commit = (record.get("commit") or "unknown commit")[:12]
    if record.get("uncommitted_changes"):
        commit += " with uncommitted changes"
    return f"Measured {record.get('date', 'undated')} at {commit}.\n\n"


def router_section(payload: dict, out: Path) -> Section:
    section = Section()
    results = payload.get("results", {})
    workloads = [
        name for name, figures in results.items() if name != "overhead" and isinstance(figures, dict)
    ]
    section.blocks.append(
        "TTFT: open loop; output tok/s: closed loop. Ratios are tokenyard's figure over the row's: below 1 is "
        "tokenyard ahead on TTFT, above 1 ahead on tokens/s."
    )
    for workload in workloads:
        policies = results[workload]
        ours = policies.get(SHIPPED, {})
        rows = []
        for policy in shipped_first(policies):
            f = policies[policy]
            rows.append(
                [
                    policy,
                    router_kind(policy, payload),
                    fmt(f.get("ttft_p50_s")),
                    fmt(f.get("ttft_p99_s")),
                    ratio(ours.get("ttft_p99_s"), f.get("ttft_p99_s")),
                    fmt(f.get("output_tok_s"), 0),
                    ratio(ours.get("output_tok_s"), f.get("output_tok_s")),
                    fmt(f.get("prefix_hit_rate")),
                    fmt(f.get("errors"), 0),
                ]
            )
        header = ["policy", "row", "TTFT p50 s", "TTFT p99 s", "tokenyard ÷ this, p99", "output tok/s"]
        header += ["tokenyard ÷ this, tok/s", "prefix hit rate", "errors"]
        section.blocks.append(f"### {workload}\n\n" + part_line(payload, workload) + table(header, rows))
        kinds = {policy: router_kind(policy, payload) for policy in policies}
        plot = plot_ttft_cdf(workload, policies, kinds, out / ROUTER_PLOT.format(workload=workload))
        if plot:
            section.add_plot(plot)
        else:
            section.blocks.append(
                f"No TTFT CDF for {workload}: the result has no TTFT quantiles (ttft_cdf_s)."
            )
    overhead = results.get("overhead")
    if isinstance(overhead, dict):
        ours = overhead.get(SHIPPED, {})
        rows = [
            [
                name,
                fmt(o.get("added_p50_ms")),
                fmt(o.get("added_p99_ms")),
                ratio(ours.get("added_p99_ms"), o.get("added_p99_ms")),
                fmt(o.get("max_rps"), 1),
            ]
            for name, o in ((n, overhead[n]) for n in shipped_first(overhead))
        ]
        header = ["router", "added p50 ms", "added p99 ms", "tokenyard ÷ this, p99", "max req/s"]
        section.blocks.append(
            "### router overhead (one hop)\n\n" + part_line(payload, "overhead") + table(header, rows)
        )
    return section


def plot_ttft_cdf(workload: str, policies: dict, kinds: dict[str, str], path: Path) -> Path | None:
    """Left: the CDF; right: the tail (the share of requests slower than x, log scale), where p99 differs."""
    curves = {}
    for policy, f in policies.items():
        seconds, percents = f.get("ttft_cdf_s") or [], f.get("ttft_cdf_percent") or []
        if len(seconds) != len(
            percents
        ):  # not a CDF this report can read: the policy is left out of the plot
            continue
        points = [(s, p / 100) for s, p in zip(seconds, percents, strict=True) if is_number(s) and s > 0]
        if points:
            curves[policy] = points
    if not curves:
        return None
    figure, (cdf_axes, tail_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    peers = iter(PEER_COLOURS)
    for policy in shipped_first(curves):
        points, ours = curves[policy], policy == SHIPPED
        style = {
            "color": OURS_COLOUR if ours else next(peers, "black"),
            "linewidth": 2.4 if ours else 1.3,
            "zorder": 3 if ours else 2,
        }
        seconds = [s for s, _ in points]
        cdf_axes.step(
            seconds, [q for _, q in points], where="post", label=f"{policy}: {kinds[policy]}", **style
        )
        tail = [(s, 1 - q) for s, q in points if q >= 0.5]
        tail_axes.step([s for s, _ in tail], [share for _, share in tail], where="post", **style)
    for axes in (cdf_axes, tail_axes):
        axes.set_xscale("log")
        axes.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.set_xlabel("time to first token (s, log scale)")
        axes.grid(True, which="both", alpha=0.3)
    cdf_axes.set_ylabel("share of requests within x")
    cdf_axes.set_ylim(0, 1.0)
    cdf_axes.set_title(f"Router TTFT CDF: {workload} (open loop)")
    cdf_axes.legend(loc="lower right", fontsize=7)
    tail_axes.set_yscale("log")
    tail_axes.set_ylim(0.0008, 0.6)
    tail_axes.set_yticks([0.5, 0.1, 0.01, 0.001], ["p50", "p90", "p99", "p99.9"])
    tail_axes.set_ylabel("share of requests slower than x")
    tail_axes.set_title("the tail")
    return save(figure, path)


# --- autoscaler -------------------------------------------------------------------------------------------------


def autoscaler_section(payload: dict, out: Path) -> Section:
    section = Section()
    results = payload.get("results", {})
    floor, slo = payload.get("slo_floor"), payload.get("ttft_slo_s")
    seeds = payload.get("evaluation_seeds")
    section.blocks.append(
        f"Means over the evaluation seeds {seeds if seeds else '(not recorded)'} ± standard error; TTFT SLO "
        f"{fmt(slo, 1)} s, floor {fmt(floor, 0, percent=True)} of requests. Ratios are tokenyard's GPU-hours over "
        "the row's (below 1: tokenyard cheaper) and tokenyard's SLO attainment minus the row's, paired per seed."
        + (
            f" Scored from {fmt(payload['scored_from_s'], 0)} s into each trace on (a warm-up from 2 groups, the same"
            " for every policy)."
            if payload.get("scored_from_s")
            else ""
        )
    )
    rows = []
    for name in shipped_first(results):
        r = results[name]
        rows.append(
            [
                name,
                str(r.get("row", "-")),
                str(r.get("setting", "-")),
                with_se(r, "slo_attainment", 2, percent=True),
                with_se(r, "gpu_hours", 1),
                with_se(r, "tokenyard_gpu_hours_ratio", 3),
                with_se(r, "tokenyard_slo_gap", 2, percent=True),
                fmt(r.get("scale_actions"), 0),
            ]
        )
    header = [
        "policy",
        "row",
        "setting",
        "SLO met",
        "GPU-hours",
        "tokenyard ÷ this, GPU-h",
        "tokenyard SLO gap",
    ]
    section.blocks.append(table(header + ["scale actions"], rows))
    plot = plot_autoscaler(results, floor, out / AUTOSCALER_PLOT)
    if plot:
        section.add_plot(plot)
    return section


AUTOSCALER_ZOOM_BELOW_FLOOR = 0.02
AUTOSCALER_MARKERS = {"tuned": "o", "documented": "s", "oracle": "D"}


def plot_autoscaler(results: dict, floor: object, path: Path) -> Path | None:
    points = {
        name: r
        for name, r in results.items()
        if is_number(r.get("gpu_hours")) and is_number(r.get("slo_attainment"))
    }
    if not points:
        return None
    # The claim is made near the floor, where the rows that meet it differ by tenths of a percent: a second
    # panel zooms on them (the first shows every row, documented defaults far below included).
    near = AUTOSCALER_ZOOM_BELOW_FLOOR
    zoom = {n: r for n, r in points.items() if is_number(floor) and r["slo_attainment"] >= floor - near}
    figure, panels = plt.subplots(1, 2 if zoom else 1, figsize=(13 if zoom else 8, 5), squeeze=False)
    colours, peers = {}, iter(PEER_COLOURS)
    for name in shipped_first(points):
        colours[name] = OURS_COLOUR if name.startswith(SHIPPED) else next(peers, "black")
    for axes, shown in zip(panels[0], (points, zoom) if zoom else (points,), strict=True):
        for name in shipped_first(shown):
            r, kind = shown[name], shown[name].get("row", "")
            axes.errorbar(
                r["gpu_hours"],
                r["slo_attainment"] * 100,
                xerr=r.get("gpu_hours_se") if is_number(r.get("gpu_hours_se")) else None,
                yerr=r["slo_attainment_se"] * 100 if is_number(r.get("slo_attainment_se")) else None,
                fmt=AUTOSCALER_MARKERS.get(kind, "^"),
                color=colours[name],
                markerfacecolor="none" if kind == "oracle" else colours[name],
                markersize=9 if name == SHIPPED else 7,
                capsize=3,
                label=f"{name}: {kind}" if kind else name,
            )
        if is_number(floor):
            axes.axhline(
                floor * 100, color="black", linestyle="--", linewidth=1, label=f"SLO floor {floor:.0%}"
            )
        axes.set_xlabel("GPU-hours (fewer is better)")
        axes.set_ylabel("requests within the TTFT SLO (%)")
        axes.grid(True, alpha=0.3)
    panels[0][0].set_title("Autoscalers: SLO attainment against GPU-hours")
    if zoom:
        panels[0][1].set_title(f"the rows within {near:.0%} of the floor")
    panels[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save(figure, path)


# --- rollout ------------------------------------------------------------------------------------------------------


def rollout_rows(results: dict) -> dict[str, dict]:
    """Every rule's figures under one flat name: the top-level rows (tokenyard, the reference SPRT) and each
    threshold rule's settings ('argo_failure_limit documented_example', ...)."""
    rows: dict[str, dict] = {}
    for name, value in results.items():
        if not isinstance(value, dict):
            continue
        if "false_rollback_rate" in value:
            rows[name] = value
            continue
        for setting, figures in value.items():
            if isinstance(figures, dict) and "false_rollback_rate" in figures:
                rows[f"{name} {setting}"] = figures
    return rows


def rollout_kind(name: str) -> str:
    if name == SHIPPED:
        return "shipped"
    for word, kind in (("oracle", "oracle"), ("tuned", "peer, tuned"), ("documented", "peer, documented")):
        if word in name:
            return kind
    return "reference"


def readable_key(key: str) -> str:
    """'1_25x' -> '1.25x', 'baseline_shifted' -> 'baseline shifted'."""
    return re.sub(r"(\d)_(\d)", r"\1.\2", key).replace("_", " ").strip()


def detection(figures: dict, effect: str) -> str:
    """'960 (100%)': the median canary requests before a rollback, and the share of bad canaries caught."""
    requests, caught = figures.get(f"detect_requests_{effect}"), figures.get(f"detect_rate_{effect}")
    shown = fmt(requests, 0) if is_number(requests) else "never"
    return f"{shown} ({fmt(caught, 0, percent=True)})" if is_number(caught) else shown


def rollout_section(payload: dict, out: Path) -> Section:
    section = Section()
    results = payload.get("results", {})
    rows = rollout_rows(results)
    if not rows:
        section.blocks.append("The result holds no rule with a false_rollback_rate.")
        return section
    ours = rows.get(SHIPPED, next(iter(rows.values())))
    populations = [key for key in ours if key.startswith("false_rollback_rate") and not key.endswith("_se")]
    effects = [key.removeprefix("detect_requests_") for key in ours if key.startswith("detect_requests_")]
    section.blocks.append(
        f"alpha = {fmt(results.get('alpha'), 2)}. False rollbacks: share of A/A rollouts rolled back (± standard "
        "error), per population. Detection: median canary requests before the rollback of a bad canary at each "
        "effect ('never': fewer than half caught), with the share caught. The ratio is tokenyard's requests at 2x "
        "over the row's (below 1: tokenyard faster)."
    )
    body = []
    for name in shipped_first(rows):
        f = rows[name]
        cells = [name, rollout_kind(name)]
        cells += [with_se(f, key, 4) for key in populations]
        cells += [detection(f, effect) for effect in effects]
        cells.append(ratio(ours.get("detect_requests_2x"), f.get("detect_requests_2x")))
        body.append(cells)
    header = ["rule", "row"]
    header += [
        f"false rollbacks {readable_key(key.removeprefix('false_rollback_rate'))}".strip()
        for key in populations
    ]
    header += [f"requests at {readable_key(effect)}" for effect in effects]
    section.blocks.append(table(header + ["tokenyard ÷ this, 2x"], body))
    plot = plot_rollout(rows, results.get("alpha"), out / ROLLOUT_PLOT)
    if plot:
        section.add_plot(plot)
    return section


ROLLOUT_MARKERS = {
    "shipped": "o",
    "peer, documented": "s",
    "peer, tuned": "^",
    "oracle": "D",
    "reference": "P",
}
# a rule's settings of one kind told apart by marker (its colour is the rule's)
ROLLOUT_SETTING_MARKERS = {"documented_example_threshold_2x": "p", "oracle_for_2x_known_baseline": "d"}


def plot_rollout(rows: dict[str, dict], alpha: object, path: Path) -> Path | None:
    plotted = {name: f for name, f in rows.items() if is_number(f.get("false_rollback_rate"))}
    if not plotted:
        return None
    detected = [f["detect_requests_2x"] for f in plotted.values() if is_number(f.get("detect_requests_2x"))]
    # A rule that catches fewer than half of the 2x canaries has no detection delay: drawn at a 'never' column.
    never_x = max(detected) * 2.5 if detected else 1.0

    def x_of(figures: dict) -> float:
        value = figures.get("detect_requests_2x")
        return value if is_number(value) else never_x

    figure, axes = plt.subplots(figsize=(9, 5))
    families: dict[str, str] = {}
    peers = iter(PEER_COLOURS)
    for name in shipped_first(plotted):
        f = plotted[name]
        family = name.split(" ")[0]
        if family not in families:
            families[family] = OURS_COLOUR if family == SHIPPED else next(peers, "black")
        kind = rollout_kind(name)
        se = f.get("false_rollback_rate_se")
        axes.errorbar(
            x_of(f),
            f["false_rollback_rate"],
            yerr=se if is_number(se) else None,
            fmt=ROLLOUT_SETTING_MARKERS.get(name.partition(" ")[2], ROLLOUT_MARKERS.get(kind, "o")),
            color=families[family],
            markerfacecolor="none" if kind == "oracle" else families[family],
            markersize=9 if name == SHIPPED else 7,
            capsize=3,
            label=f"{name}: {kind}",
            zorder=3,
        )
    by_alpha = rows.get(SHIPPED, {}).get("by_alpha")
    if isinstance(by_alpha, dict):
        curve = sorted(
            (x_of(f), f["false_rollback_rate"], level)
            for level, f in by_alpha.items()
            if is_number(f.get("false_rollback_rate"))
        )
        if len(curve) > 1:
            axes.plot(
                [x for x, _, _ in curve],
                [y for _, y, _ in curve],
                color=OURS_COLOUR,
                linewidth=1,
                alpha=0.6,
                label="tokenyard at other alpha",
            )
            for x, y, level in curve:
                axes.annotate(f"α={level}", (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    if is_number(alpha):
        axes.axhline(alpha, color="black", linestyle="--", linewidth=1, label=f"alpha {alpha:g}")
    axes.set_xscale("log")
    low, divider = min(x_of(f) for f in plotted.values()) / 1.5, never_x / 1.6
    axes.axvline(divider, color="gray", linewidth=0.6)
    ticks = [t for t in LogLocator(subs=(1.0, 2.0, 5.0)).tick_values(low, divider) if low <= t < divider]
    axes.minorticks_off()
    axes.set_xticks(ticks + [never_x], [f"{t:,.0f}" for t in ticks] + ["never"])
    axes.set_xlim(low, never_x * 1.5)
    axes.set_xlabel("median canary requests to roll back a 2x regression (log scale)")
    # symmetric log: rules that never roll back (0), those near alpha and a documented example near 0.7 all in view
    axes.set_yscale("symlog", linthresh=0.01, linscale=0.5)
    axes.set_ylim(-0.002, 1.0)
    axes.set_yticks(
        [0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0], ["0", "0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1"]
    )
    axes.set_ylabel("false-rollback rate (A/A, usual day; symmetric log scale)")
    axes.grid(True, alpha=0.3)
    axes.set_title("Rollout rules: false rollbacks against detection delay")
    axes.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save(figure, path)


# --- placement ----------------------------------------------------------------------------------------------------

PLACEMENT_KINDS = {
    SHIPPED: "shipped",
    "tokenyard_told_mix": "oracle (told the arrival mix)",
    "lower_bound": "oracle (repacks every group)",
    "first_fit_unaligned": "peer, extra",
}


def placement_section(payload: dict, out: Path) -> Section:
    section = Section()
    results = payload.get("results", {})
    ours = results.get(SHIPPED, {})
    section.blocks.append(
        f"Offered load {fmt(payload.get('load'), 2)}. Stranded: mean free GPUs an arriving group could not use "
        "(lower_bound: the floor). Ratios are tokenyard's figure over the row's."
    )
    rows = []
    for name in shipped_first(results):
        f = results[name]
        rows.append(
            [
                name,
                PLACEMENT_KINDS.get(name, "peer"),
                fmt(f.get("accepted"), 0),
                ratio(ours.get("accepted"), f.get("accepted"), 3),
                fmt(f.get("accepted_gpus"), 0),
                fmt(f.get("stranded_gpus_mean"), 2),
                ratio(ours.get("stranded_gpus_mean"), f.get("stranded_gpus_mean")),
                fmt(f.get("stranded_floor_gpus_mean"), 2),
                fmt(f.get("place_ms_p99"), 3),
            ]
        )
    header = [
        "strategy",
        "row",
        "accepted groups",
        "tokenyard ÷ this, groups",
        "accepted GPUs",
        "stranded GPUs",
    ]
    header += ["tokenyard ÷ this, stranded", "stranded floor", "place p99 ms"]
    section.blocks.append(table(header, rows))
    by_load = payload.get("by_load") or {}
    if by_load:
        names = shipped_first(dict.fromkeys(name for figures in by_load.values() for name in figures))
        body = [
            [load]
            + [
                f"{fmt(figures.get(name, {}).get('accepted'), 0)} / "
                f"{fmt(figures.get(name, {}).get('stranded_gpus_mean'), 2)}"
                for name in names
            ]
            for load, figures in by_load.items()
        ]
        section.blocks.append(
            "Other offered loads, same seed (accepted groups / stranded GPUs):\n\n"
            + table(["load"] + names, body)
        )
    plot = plot_placement(payload, out / PLACEMENT_PLOT)
    if plot:
        section.add_plot(plot)
    return section


def stranded_by_load(payload: dict) -> dict[str, list[tuple[float, float]]]:
    """Each strategy's (offered load, mean stranded GPUs) points: the main run's load and the by_load runs."""
    loads = {}
    if is_number(payload.get("load")):
        loads[float(payload["load"])] = payload.get("results", {})
    for load, figures in (payload.get("by_load") or {}).items():
        try:
            loads[float(load)] = figures
        except ValueError:
            continue
    series: dict[str, list[tuple[float, float]]] = {}
    for load in sorted(loads):
        for name, figures in loads[load].items():
            if isinstance(figures, dict) and is_number(figures.get("stranded_gpus_mean")):
                series.setdefault(name, []).append((load, figures["stranded_gpus_mean"]))
    return series


def plot_placement(payload: dict, path: Path) -> Path | None:
    series = stranded_by_load(payload)
    if not series:
        return None
    figure, axes = plt.subplots(figsize=(8, 5))
    peers = iter(PEER_COLOURS)
    for name in shipped_first(series):
        points = series[name]
        kind = PLACEMENT_KINDS.get(name, "peer")
        colour = OURS_COLOUR if name == SHIPPED else next(peers, "black")
        axes.plot(
            [load for load, _ in points],
            [stranded for _, stranded in points],
            marker="o" if "oracle" not in kind else "D",
            linestyle="-" if "oracle" not in kind else "--",
            color=colour,
            linewidth=2.4 if name == SHIPPED else 1.3,
            markerfacecolor="none" if "oracle" in kind else colour,
            label=f"{name}: {kind}",
        )
    values = [stranded for points in series.values() for _, stranded in points]
    # the oracle strands ~2 GPUs where a spreading scheduler strands hundreds: a log scale shows both
    logarithmic = min(values) > 0 and max(values) / min(values) > 20
    if logarithmic:
        axes.set_yscale("log")
    axes.set_xlabel("offered load (share of the cluster's GPUs)")
    axes.set_ylabel("mean stranded GPUs (fewer is better" + (", log scale)" if logarithmic else ")"))
    axes.grid(True, alpha=0.3)
    axes.set_title("Placement: stranded GPUs against offered load")
    axes.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save(figure, path)


# --- sim and operator on a cluster (tables only) -------------------------------------------------------------------


def sim_section(payload: dict, out: Path) -> Section:
    results = payload.get("results", {})
    rows = []
    for preset, entry in results.items():
        # a preset's entry holds each figure beside its `<figure>_published` (None where none was found)
        if not isinstance(entry, dict):
            continue
        for metric in (key for key in entry if f"{key}_published" in entry):
            published = entry[f"{metric}_published"]
            role = entry.get(f"{metric}_role") or ("-" if published is None else "")
            rows.append(
                [
                    preset,
                    metric,
                    fmt(entry[metric], 1),
                    fmt(published, 1),
                    ratio(entry[metric], published),
                    role,
                ]
            )
    blocks = [
        "The simulator against published figures (ratio: simulated ÷ published; '-': no published figure). "
        "Role: `fit`, the per-sequence step cost was fitted to it; `held out`, a check of that fit; `excluded`, "
        "something besides the engine limits it (the run's text output says what).",
        table(["preset", "metric", "simulated", "published", "ratio", "role"], rows),
    ]
    matched = results.get("within_15_percent")
    if isinstance(matched, dict):
        counts = [
            [group, f"{fmt(c.get('within'), 0)} of {fmt(c.get('of'), 0)}"] for group, c in matched.items()
        ]
        blocks.append("Published figures matched within 15%:\n\n" + table(["figures", "within 15%"], counts))
    capacity = results.get("capacity")
    if isinstance(capacity, dict):
        blocks.append(
            f"One event loop serves {fmt(capacity.get('streamed_tok_s_per_core'), 0)} streamed tokens/s with "
            f"timing within 5% (load average {fmt(capacity.get('load_average'), 2)} during the run)."
        )
    return Section(blocks)


def operator_cluster_section(payload: dict, out: Path) -> Section:
    pairs = payload.get("comparison")
    if isinstance(pairs, list):
        rows = [
            [
                str(p.get("measure")),
                fmt(p.get("tokenyard_s"), 2),
                fmt(p.get("deployment_s"), 2),
                ratio(p.get("tokenyard_s"), p.get("deployment_s")),
            ]
            for p in pairs
        ]
        header = ["measure", "tokenyard s", "Deployment s", "tokenyard ÷ Deployment"]
        return Section([table(header, rows)])
    # results written before the comparison was recorded: each side's figures as they are
    results = payload.get("results", {})
    rows = [
        [side, key, fmt(value, 2)]
        for side in shipped_first(results)
        for key, value in (results[side] or {}).items()
    ]
    return Section([table(["side", "measure", "seconds"], rows)])


SECTIONS: dict[str, Callable[[dict, Path], Section]] = {
    "sim": sim_section,
    "router": router_section,
    "placement": placement_section,
    "autoscaler": autoscaler_section,
    "rollout": rollout_section,
    "operator_cluster": operator_cluster_section,
}


# --- reading and writing ----------------------------------------------------------------------------------------


def save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def read_result(path: Path, bench: str) -> dict:
    """The benchmark's results object; ValueError naming the file and what is wrong with it."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not readable as JSON ({error})") from error
    if not isinstance(payload, dict) or not isinstance(payload.get("results"), dict):
        raise ValueError(f"{path}: not a benchmark result (expected an object with a 'results' object)")
    if payload.get("bench", bench) != bench:
        raise ValueError(f"{path}: holds the results of bench {payload.get('bench')!r}, not {bench!r}")
    return payload


def write_report(folder: Path) -> tuple[Path, list[str]]:
    """RESULTS.md and the plots in ``folder``; returns the report's path and the problems found (unreadable
    results files, said in the report too)."""
    problems: list[str] = []
    summary, parts = [], []
    # this report's own plots from an earlier report: one whose data is gone now must not stay beside the page
    for pattern in PLOT_PATTERNS:
        for stale in folder.glob(pattern):
            stale.unlink()
    for bench, target in BENCHES.items():
        path = folder / f"{bench}.json"
        heading = f"## {bench}"
        if not path.exists():
            summary.append([bench, "not run", f"`make {target}` writes {path.name}"])
            parts.append(
                f"{heading}\n\nNot run: no {path.name} in this directory (`make {target}` writes it)."
            )
            continue
        try:
            payload = read_result(path, bench)
            section = SECTIONS[bench](payload, folder)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            # one malformed file costs its own section only
            problem = str(error) if isinstance(error, ValueError) else f"{path}: unexpected shape ({error!r})"
            problems.append(problem)
            summary.append([bench, "unreadable", problem])
            parts.append(f"{heading}\n\nUnreadable: {problem}")
            continue
        run = payload.get("run") or {}
        summary.append(
            [bench, "ok", f"{run.get('date', 'undated')}, {(run.get('commit') or 'no commit')[:12]}"]
        )
        blocks = [heading, run_line(payload), *section.blocks]
        parts.append("\n\n".join(blocks))
    others = sorted(p.name for p in folder.glob("*.json") if p.stem not in BENCHES)
    page = ["# Benchmark results", "Written by `bench/report.py` from the results files in this directory."]
    page.append(table(["bench", "status", "run"], summary))
    if others:
        page.append("Other results files, not summarised here: " + ", ".join(others) + ".")
    report = folder / REPORT_NAME
    report.write_text("\n\n".join(page + parts) + "\n")
    return report, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="the directory of <bench>.json files, where the report and plots are written "
        "(default: BENCH_RESULTS_DIR, else bench/results)",
    )
    args = parser.parse_args(argv)
    folder = args.results_dir or results_dir()
    if not folder.is_dir():
        parser.error(f"--results-dir {folder}: not a directory")
    report, problems = write_report(folder)
    print(f"report written to {report}")
    for problem in problems:
        print(f"report: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
