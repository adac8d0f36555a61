"""One async client of Prometheus's instant-query HTTP API, shared by the autoscaler and the operator's
rollout analysis.

Every failure -- Prometheus unreachable, a timeout, an HTTP or PromQL error, an empty result, a NaN --
comes back as a reading with no value and the reason, never as zero: zero waiting requests means
"scale down", zero errors means "promote", and a dead Prometheus must say neither.

- `Reading` (one number) and `parse_query_response` (pure) for queries that aggregate to one sample;
- `VectorReading` (samples with their labels) and `parse_vector_response` (pure) for queries whose series
  the caller tells apart (per revision, per bucket);
- `MatrixReading` (series of points over time) and `parse_matrix_response` (pure) for range queries, which
  the rollout analysis uses to see how failures were spread over a window and the hour before it;
- `PrometheusClient.query` / `query_vector` / `query_range`, which never raise for Prometheus's failures.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True)
class Reading:
    """One query's outcome: a value, or why there is none."""

    value: float | None
    problem: str = ""
    sampled_at: float | None = None  # Prometheus's evaluation time (unix seconds)

    @property
    def ok(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels and its (finite) value."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class VectorReading:
    """One query's samples, or why there are none. An empty result is ``ok`` with no samples (``empty``), so
    the caller decides what a missing series means; a failure (``samples`` None) never reads as empty."""

    samples: tuple[Sample, ...] | None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return self.samples is not None

    @property
    def empty(self) -> bool:
        return self.samples == ()


@dataclass(frozen=True)
class Series:
    """One series of a range query: its labels and its (finite) points, (unix seconds, value), oldest first."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class MatrixReading:
    """A range query's series, or why there are none (``series`` None). No series is ``ok``: the caller
    decides what a missing series means."""

    series: tuple[Series, ...] | None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return self.series is not None


def _failure(http_status: int, body: Any) -> str | None:
    """Why an /api/v1/query response is not a successful result, or None when it is."""
    if not isinstance(body, dict):
        return f"HTTP {http_status}: response is not a JSON object"
    if body.get("status") != "success":
        error = body.get("error") or "no error message"
        return f"HTTP {http_status}: {body.get('errorType', 'error')}: {error}"
    return None


def parse_query_response(http_status: int, body: Any, query: str) -> Reading:
    """Turn an /api/v1/query response into a Reading (pure, so it is tested without a server)."""
    problem = _failure(http_status, body)
    if problem:
        return Reading(None, problem)
    data = body.get("data") or {}
    result_type, result = data.get("resultType"), data.get("result")
    if result_type == "scalar":
        sample = result
    elif result_type == "vector":
        if not result:
            return Reading(None, "empty result (no series match)")
        if len(result) > 1:
            return Reading(None, f"{len(result)} series, expected one: aggregate the query (sum, avg)")
        sample = result[0].get("value")
    else:
        return Reading(None, f"result type {result_type!r}, expected a vector or scalar")
    try:
        at, raw = float(sample[0]), float(sample[1])
    except (TypeError, ValueError, IndexError):
        return Reading(None, f"malformed sample {sample!r}")
    if not math.isfinite(raw):
        return Reading(None, f"value is {raw}", at)
    return Reading(raw, "", at)


def parse_vector_response(http_status: int, body: Any, query: str) -> VectorReading:
    """Turn an /api/v1/query response into the finite samples of its series (pure). A scalar is one sample
    without labels; samples whose value is NaN or infinite are left out."""
    problem = _failure(http_status, body)
    if problem:
        return VectorReading(None, f"{problem} (query: {query})")
    data = body.get("data") or {}
    result_type, result = data.get("resultType"), data.get("result")
    try:
        if result_type == "scalar":
            pairs = [({}, float(result[1]))]
        elif result_type == "vector":
            pairs = [(dict(s.get("metric") or {}), float(s["value"][1])) for s in result or ()]
        else:
            return VectorReading(
                None, f"result type {result_type!r}, expected a vector or scalar (query: {query})"
            )
    except (TypeError, ValueError, IndexError, KeyError, AttributeError):
        return VectorReading(None, f"malformed result {result!r} (query: {query})")
    samples = tuple(Sample(labels, value) for labels, value in pairs if math.isfinite(value))
    return VectorReading(samples, "" if samples else "empty result (no series match)")


def parse_matrix_response(http_status: int, body: Any, query: str) -> MatrixReading:
    """Turn an /api/v1/query_range response into its series (pure); NaN and infinite points are left out."""
    problem = _failure(http_status, body)
    if problem:
        return MatrixReading(None, f"{problem} (query: {query})")
    data = body.get("data") or {}
    result_type, result = data.get("resultType"), data.get("result")
    if result_type != "matrix":
        return MatrixReading(None, f"result type {result_type!r}, expected a matrix (query: {query})")
    try:
        series = []
        for one in result or ():
            points = ((float(at), float(value)) for at, value in one.get("values") or ())
            finite = tuple((at, value) for at, value in points if math.isfinite(value))
            series.append(Series(dict(one.get("metric") or {}), finite))
    except (TypeError, ValueError, AttributeError):
        return MatrixReading(None, f"malformed result {result!r} (query: {query})")
    return MatrixReading(tuple(series))


class PrometheusClient:
    """A small async client of Prometheus's instant-query API. One per process; close() when done."""

    def __init__(self, base_url: str, timeout_s: float = 5.0, session: aiohttp.ClientSession | None = None):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._session = session
        self._own_session = session is None

    async def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
            self._own_session = True
        return self._session

    async def _get(
        self, promql: str, at: float | None, endpoint: str = "query", **extra: str
    ) -> tuple[int, Any] | str:
        """(HTTP status, parsed JSON body), or why there is none."""
        url = f"{self.base_url}/api/v1/{endpoint}"
        params = {"query": promql, **extra}
        if at is not None:
            params["time"] = f"{at:.3f}"
        session = await self._get_session()
        try:
            async with session.get(
                url, params=params, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as response:
                try:
                    return response.status, await response.json(content_type=None)
                except (aiohttp.ContentTypeError, ValueError):
                    return f"HTTP {response.status} from {url}: body is not JSON"
        except TimeoutError:
            return f"Prometheus at {self.base_url} timed out after {self.timeout_s:g}s"
        except aiohttp.ClientError as exc:
            return f"Prometheus at {self.base_url} unreachable: {exc.__class__.__name__}: {exc}"

    async def query(self, promql: str, at: float | None = None) -> Reading:
        got = await self._get(promql, at)
        if isinstance(got, str):
            return Reading(None, got)
        return parse_query_response(*got, promql)

    async def query_vector(self, promql: str, at: float | None = None) -> VectorReading:
        got = await self._get(promql, at)
        if isinstance(got, str):
            return VectorReading(None, got)
        return parse_vector_response(*got, promql)

    async def query_range(self, promql: str, start: float, end: float, step: float) -> MatrixReading:
        """The query evaluated at start, start + step, ... up to end."""
        got = await self._get(
            promql, None, "query_range", start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}"
        )
        if isinstance(got, str):
            return MatrixReading(None, got)
        return parse_matrix_response(*got, promql)

    async def query_many(self, queries: dict[str, str], at: float | None = None) -> dict[str, Reading]:
        names = list(queries)
        readings = await asyncio.gather(*(self.query(queries[n], at) for n in names))
        return dict(zip(names, readings, strict=True))

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
