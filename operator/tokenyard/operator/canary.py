"""Between the ModelDeployment and the rollout cores: spec and status in, rollout inputs out, and the analysis'
measurements read from Prometheus.

- `strategy_from_spec` turns `spec.rollout` (already validated by the API server and parsed by the types) into
  the state machine's `Strategy`;
- `commands_from` reads manual commands: the `tokenyard.dev/rollout-command` annotation that
  `kubectl tokenyard rollout promote|abort|pause|resume` writes, and `spec.paused`;
- `PrometheusAnalysis` measures each revision over the analysis window from the router's metrics and asks the
  sequential test for a verdict. No Prometheus, an error, or no samples are inconclusive, never a failure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import aiohttp
from tokenyard.core.metrics import bucket_at_or_below
from tokenyard.core.types import AnalysisMetricKind, ModelDeploymentSpec
from tokenyard.operator.analysis import (
    AnalysisResult,
    AnalysisSettings,
    Decision,
    Margin,
    MetricInput,
    ProportionCounts,
    evaluate,
)
from tokenyard.operator.rollout import (
    AnalysisStep,
    Command,
    CommandKind,
    PauseReason,
    PauseStep,
    RolloutState,
    SetWeightStep,
    ShadowStep,
    Strategy,
)

COMMAND_ANNOTATION = "tokenyard.dev/rollout-command"


def strategy_from_spec(spec: ModelDeploymentSpec) -> Strategy:
    steps = []
    for step in spec.rollout.steps:
        if step.set_weight is not None:
            steps.append(SetWeightStep(step.set_weight))
        elif step.pause is not None:
            steps.append(PauseStep(None if step.pause.duration_seconds is None else float(step.pause.duration_seconds)))
        elif step.shadow is not None:
            steps.append(ShadowStep(step.shadow.fraction, float(step.shadow.duration_seconds)))
        elif step.analysis is not None:
            steps.append(AnalysisStep(float(step.analysis.timeout_seconds)))
    return Strategy(
        tuple(steps),
        replicas=max(1, spec.replicas),
        # The canary gets the groups its traffic weight needs (the stable revision keeps all of its own);
        # rollout.maxSurge bounds rolling updates, not the canary's size.
        max_surge=None,
        drain_timeout_s=float(spec.rollout.drain_seconds),
        auto_rollback=spec.rollout.auto_rollback,
    )


def state_from_status(status: Mapping[str, Any], update_revision: str) -> RolloutState:
    """The rollout state saved in the status, or a finished rollout of the first revision seen."""
    saved = ((status or {}).get("rollout") or {}).get("state")
    if saved:
        return RolloutState.from_dict(saved)
    return RolloutState(stable_revision=(status or {}).get("currentRevision") or update_revision)


def commands_from(annotations: Mapping[str, str], paused: bool, state: RolloutState) -> tuple[Command, ...]:
    commands: list[Command] = []
    raw = annotations.get(COMMAND_ANNOTATION)
    if raw:
        try:
            parsed = json.loads(raw)
            commands.append(Command(CommandKind(parsed["command"]), str(parsed["id"])))
        except (ValueError, KeyError, TypeError):
            pass  # a malformed annotation is reported by the adapter's event, and ignored here
    # spec.paused is level-based: translate its value into the matching command once per change.
    if paused and state.pause_reason is None and not state.phase.terminal:
        commands.append(Command(CommandKind.PAUSE, f"spec.paused@{state.canary_revision}"))
    if not paused and state.pause_reason is PauseReason.USER:
        commands.append(Command(CommandKind.RESUME, f"spec.unpaused@{state.canary_revision}@{state.paused_at}"))
    return tuple(commands)


def _settings(spec: ModelDeploymentSpec) -> AnalysisSettings:
    analysis = spec.rollout.analysis
    return AnalysisSettings(alpha=analysis.alpha, margin=Margin(absolute=analysis.margin), min_requests=analysis.min_requests)


class PrometheusAnalysis:
    """Counts per revision from the router's metrics in Prometheus, judged by the sequential test."""

    def __init__(self, url: str | None, timeout: float = 5.0):
        self.url = url.rstrip("/") if url else None
        self.timeout = aiohttp.ClientTimeout(total=timeout)

    async def judge(
        self,
        spec: ModelDeploymentSpec,
        model: str,
        stable: str,
        canary: str,
        since: float,
        now: float,
        final: bool,
        shadow: bool,
    ) -> AnalysisResult:
        if not self.url:
            return AnalysisResult(Decision.INCONCLUSIVE, "no Prometheus configured for the analysis (--prometheus-url)", ())
        window = f"{max(1, math.ceil(now - since))}s"
        metrics = spec.rollout.analysis.metrics or []
        kinds = [(m.name, m.kind, m.slo_seconds) for m in metrics] or [("errors", AnalysisMetricKind.ERROR_RATIO, None)]
        inputs = []
        try:
            async with aiohttp.ClientSession(timeout=self.timeout) as session:
                for name, kind, slo in kinds:
                    counts = await self._counts(session, kind, slo, model, window, shadow, stable, canary)
                    if counts is None:
                        inputs.append(MetricInput(name))  # unsupported kind: inconclusive, named
                        continue
                    canary_counts, stable_counts = counts
                    label = "share over TTFT SLO" if kind == AnalysisMetricKind.TTFT_OVER_SLO else "error ratio"
                    inputs.append(MetricInput(name, canary=canary_counts, stable=stable_counts, label=label))
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            return AnalysisResult(Decision.INCONCLUSIVE, f"Prometheus at {self.url} unreachable or failing: {e}", ())
        return evaluate(inputs, _settings(spec), final=final)

    async def _counts(self, session, kind, slo, model, window, shadow, stable, canary):
        sel = f'model="{model}"'
        if kind == AnalysisMetricKind.ERROR_RATIO:
            total = f"sum by (revision) (increase(tokenyard_router_requests_total{{{sel}}}[{window}]))"
            bad = f"sum by (revision) (increase(tokenyard_router_errors_total{{{sel}}}[{window}]))"
        elif kind == AnalysisMetricKind.TTFT_OVER_SLO:
            total = f"sum by (revision) (increase(tokenyard_router_time_to_first_token_seconds_count{{{sel}}}[{window}]))"
            fast = (
                f'sum by (revision) (increase(tokenyard_router_time_to_first_token_seconds_bucket{{{sel},le="{_le(slo)}"}}[{window}]))'
            )
            bad = f"({total}) - ({fast})"
        else:
            return None
        totals, bads = await self._by_revision(session, total), await self._by_revision(session, bad)
        if shadow:
            # A shadow step's canary answers only copies: its counts come from the shadow metrics.
            # Dropped copies (no shadow replica available, or too many in flight) were never answered.
            shadow_total = (
                f'sum by (revision) (increase(tokenyard_router_shadow_requests_total{{{sel},outcome=~"ok|error"}}[{window}]))'
            )
            shadow_bad = (
                f'sum by (revision) (increase(tokenyard_router_shadow_requests_total{{{sel},outcome="error"}}[{window}]))'
            )
            totals[canary] = (await self._by_revision(session, shadow_total)).get(canary)
            bads[canary] = (await self._by_revision(session, shadow_bad)).get(canary, 0.0 if totals[canary] else None)

        def counts(revision):
            requests = totals.get(revision)
            events = bads.get(revision, 0.0 if requests is not None else None)
            if requests is not None and events is not None:
                # increase() extrapolates each series on its own, so errors can exceed requests by a hair.
                events = min(events, requests)
            return ProportionCounts(requests, events)

        return counts(canary), counts(stable)

    async def _by_revision(self, session: aiohttp.ClientSession, query: str) -> dict[str, float]:
        async with session.get(f"{self.url}/api/v1/query", params={"query": query}) as response:
            body = await response.json(content_type=None)
        if body.get("status") != "success":
            raise ValueError(f"query failed: {body.get('error', body)}")
        out = {}
        for sample in body["data"]["result"]:
            value = float(sample["value"][1])
            if math.isfinite(value):
                out[sample["metric"].get("revision", "")] = value
        return out


def _le(slo: float | None) -> str:
    """The router's histogram bound for an SLO (the largest bucket at or below it, since a series for any other
    `le` does not exist), formatted as prometheus_client writes `le` labels."""
    return repr(bucket_at_or_below(float(slo or 0)))
