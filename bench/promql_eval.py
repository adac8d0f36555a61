"""A small PromQL engine for the benchmarks: the autoscaler's own default queries, evaluated on simulated series.

Why not a real Prometheus: the autoscaler bench is a closed loop (each decision changes the series the next one
reads) run for hours of simulated time per grid point, with an instant query every 5 s of simulated time. A real
server would need every sample pushed to it (remote write, in timestamp order) and a round trip per query: about
13,000 round trips per simulated 6 hours and per policy, several hundred runs per bench -- hours of wall time on
a shared machine. Instead this module evaluates the same query strings (``tokenyard.autoscaler.prometheus``
builds them; nothing here restates them) on an in-memory store filled the way Prometheus's scrapes fill its
TSDB. ``tests/unit/bench/test_promql_eval.py`` checks it against worked examples of the Prometheus docs and
against the real engine (``promtool test rules``) on the shipped queries.

What is implemented is exactly what those queries use, with Prometheus 2.x semantics (the version the project's
stack runs; ``promql/engine.go``, ``promql/functions.go``, ``promql/quantile.go``):

- selectors with ``=``, ``!=``, ``=~``, ``!~`` matchers; an instant selector takes each series' newest sample
  in the 5-minute lookback ``[t - 5m, t]`` unless that sample is a staleness marker (written when a target
  disappears); a range selector ``[d]`` takes the samples in ``[t - d, t]``, staleness markers left out;
- ``rate`` (``extrapolatedRate``: counter resets, extrapolation to the range's edges when the first/last
  sample lies within 1.1 average intervals of them, else by half an interval, never below a counter's zero);
- ``histogram_quantile`` (``bucketQuantile``: buckets by ``le``, coalesced and forced monotonic, linear
  interpolation inside the bucket, the first bucket starting at 0, a rank in the +Inf bucket giving the highest
  finite bound, NaN with no observations), ``clamp_min``, ``label_replace``;
- ``sum``, ``avg``, ``max``, ``min``, ``count`` with ``by`` / ``without``;
- arithmetic and comparison operators with one-to-one vector matching (``on`` / ``ignoring``), scalars,
  and the set operators ``and``, ``or``, ``unless``; PromQL's precedence.

Anything else is refused with ``PromQLError`` naming the construct, so a change to the shipped queries that
this engine cannot follow fails loudly instead of being evaluated wrongly.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

LOOKBACK_S = 300.0  # Prometheus' default --query.lookback-delta
METRIC_NAME = "__name__"

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


class PromQLError(ValueError):
    """A query this engine cannot parse or evaluate; the message names what and where."""


def labels_of(mapping: Mapping[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in mapping.items() if v != ""))


# ---------------------------------------------------------------------------------------------- storage
@dataclass
class _Series:
    labels: Labels
    times: list[float] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)  # None: a staleness marker

    def __post_init__(self) -> None:
        self.labels_without_name = tuple(p for p in self.labels if p[0] != METRIC_NAME)


class SeriesStore:
    """Scraped samples per series, as Prometheus's TSDB holds them (append-only, in time order per series)."""

    def __init__(self, keep_seconds: float = LOOKBACK_S + 60.0) -> None:
        self.keep_seconds = keep_seconds
        self._series: dict[Labels, _Series] = {}
        self._by_name: dict[str, dict[Labels, _Series]] = {}
        # Which series a selector matches changes only when a series comes or goes: cached until then.
        self._selected: dict[tuple[_Matcher, ...], list[_Series]] = {}
        self._pruned_at = -math.inf
        # Results of the subexpressions evaluated at one time over the current samples (a query repeats some,
        # e.g. the mean prompt length, and several queries share them); dropped when time or samples change.
        self._memo: dict[int, object] = {}
        self._memo_key: tuple[float, int] = (math.nan, -1)
        self._appended = 0

    def memo_at(self, t: float) -> dict[int, object]:
        key = (t, self._appended)
        if key != self._memo_key:
            self._memo, self._memo_key = {}, key
        return self._memo

    def add(self, labels: Labels, t: float, value: float) -> None:
        self._append(labels, t, float(value))

    def mark_stale(self, labels: Labels, t: float) -> None:
        """The series' target is gone (a deleted pod): Prometheus writes a staleness marker at once."""
        if labels in self._series:
            self._append(labels, t, None)

    def _append(self, labels: Labels, t: float, value: float | None) -> None:
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = _Series(labels)
            self._by_name.setdefault(dict(labels).get(METRIC_NAME, ""), {})[labels] = series
            self._selected.clear()
        if series.times and t < series.times[-1]:
            raise PromQLError(f"out-of-order sample for {dict(labels)} at {t} (last {series.times[-1]})")
        series.times.append(t)
        series.values.append(value)
        self._appended += 1
        # Forget what no query can reach any more, in chunks (deleting a list's head is O(n)).
        cut = bisect.bisect_left(series.times, t - self.keep_seconds)
        if cut > 64:
            del series.times[:cut], series.values[:cut]
        if value is None and len(series.times) == 1:
            self._forget(labels)

    def _forget(self, labels: Labels) -> None:
        series = self._series.pop(labels)
        del self._by_name[dict(series.labels).get(METRIC_NAME, "")][labels]
        self._selected.clear()

    def prune(self, now: float) -> None:
        """Drop the series whose newest sample is a staleness marker older than any lookback (at most once a
        minute: a query never sees them anyway)."""
        if now - self._pruned_at < 60.0:
            return
        self._pruned_at = now
        for labels, series in list(self._series.items()):
            if series.values[-1] is None and series.times[-1] < now - self.keep_seconds:
                self._forget(labels)

    def select(self, matchers: tuple[_Matcher, ...]) -> list[_Series]:
        cached = self._selected.get(matchers)
        if cached is None:
            name = next((m.value for m in matchers if m.name == METRIC_NAME and m.op == "="), None)
            pool = self._by_name.get(name, {}).values() if name is not None else self._series.values()
            cached = self._selected[matchers] = [
                series
                for series in pool
                if all(m.matches(dict(series.labels).get(m.name, "")) for m in matchers)
            ]
        return cached


# ---------------------------------------------------------------------------------------------- values
@dataclass(frozen=True)
class Scalar:
    value: float


class Element(NamedTuple):
    labels: Labels
    value: float


Vector = list[Element]


# ---------------------------------------------------------------------------------------------- parsing
_TOKEN = re.compile(
    r"""\s*(?:
      (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?:[iI]nf|NaN)(?![a-zA-Z0-9_:]))
    | (?P<duration>\[\s*\d+[smhdwy]\s*\])
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    | (?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>=(){},])
    )""",
    re.VERBOSE,
)
_AGGREGATIONS = {"sum", "avg", "max", "min", "count"}
_FUNCTIONS = {"rate", "histogram_quantile", "clamp_min", "label_replace"}
_SET_OPS = {"and", "or", "unless"}
_COMPARISONS = {"==", "!=", ">", "<", ">=", "<="}
# Lowest first (PromQL: or < and/unless < comparisons < +,- < *,/,% < ^).
_PRECEDENCE = [{"or"}, {"and", "unless"}, _COMPARISONS, {"+", "-"}, {"*", "/", "%"}, {"^"}]
_DURATION_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise PromQLError(f"cannot read the query at character {pos}: {text[pos : pos + 20]!r}")
        kind = match.lastgroup
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


@dataclass(frozen=True)
class _Matcher:
    name: str
    op: str
    value: str

    def matches(self, actual: str) -> bool:
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        found = re.fullmatch(self.value, actual) is not None
        return found if self.op == "=~" else not found


# Every parsed node, by value: equal subtrees (the same subquery written twice, or in two queries) become one
# object, so that their value is computed once per evaluation.
_INTERNED: dict[object, object] = {}


def _intern(node):
    return _INTERNED.setdefault(node, node)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.tokens, self.i = text, _tokens(text), 0

    def peek(self, offset: int = 0) -> tuple[str, str] | None:
        j = self.i + offset
        return self.tokens[j] if j < len(self.tokens) else None

    def take(self, value: str | None = None, kind: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if (
            token is None
            or (value is not None and token[1] != value)
            or (kind is not None and token[0] != kind)
        ):
            wanted = value or kind
            raise PromQLError(
                f"expected {wanted!r}, found {token[1] if token else 'the end'!r} in {self.text!r}"
            )
        self.i += 1
        return token

    def at(self, *values: str) -> bool:
        token = self.peek()
        return token is not None and token[1] in values and token[0] in ("op", "ident")

    def parse(self) -> _Node:
        node = self.expr(0)
        if self.peek() is not None:
            raise PromQLError(f"unexpected {self.peek()[1]!r} in {self.text!r}")
        return node

    def expr(self, level: int) -> _Node:
        if level == len(_PRECEDENCE):
            return self.unary()
        left = self.expr(level + 1)
        while self.at(*_PRECEDENCE[level]):
            op = self.take()[1]
            if self.at("bool"):
                raise PromQLError(f"the 'bool' modifier is not supported (in {self.text!r})")
            on, labels = None, ()
            if self.at("on", "ignoring"):
                on = self.take()[1] == "on"
                labels = self.label_list()
            if self.at("group_left", "group_right"):
                raise PromQLError(f"many-to-one matching ({self.peek()[1]}) is not supported")
            # ^ is right-associative; the others are left-associative.
            right = self.expr(level if op == "^" else level + 1)
            left = _intern(_Binary(op, left, right, on, labels))
        return left

    def unary(self) -> _Node:
        if self.at("-", "+"):
            sign = self.take()[1]
            operand = self.unary()
            return _intern(_Binary("*", _Number(-1.0), operand, None, ())) if sign == "-" else operand
        return self.primary()

    def label_list(self) -> tuple[str, ...]:
        self.take("(")
        names = []
        while not self.at(")"):
            names.append(self.take(kind="ident")[1])
            if not self.at(")"):
                self.take(",")
        self.take(")")
        return tuple(names)

    def primary(self) -> _Node:
        token = self.peek()
        if token is None:
            raise PromQLError(f"the query ends too early: {self.text!r}")
        kind, value = token
        if kind == "number":
            self.i += 1
            return _intern(_Number(float(value)))
        if kind == "string":
            self.i += 1
            return _intern(_String(_unquote(value)))
        if value == "(":
            self.i += 1
            node = self.expr(0)
            self.take(")")
            return node
        if kind == "ident" and value in _AGGREGATIONS:
            return self.aggregation()
        if kind == "ident" and self.peek(1) == ("op", "("):
            if value not in _FUNCTIONS:
                raise PromQLError(f"function {value}() is not supported by the bench's PromQL engine")
            self.i += 1
            return _intern(_Call(value, self.arguments()))
        if kind == "ident" or value == "{":
            return self.selector()
        raise PromQLError(f"unexpected {value!r} in {self.text!r}")

    def arguments(self) -> tuple[_Node, ...]:
        self.take("(")
        args = []
        while not self.at(")"):
            args.append(self.expr(0))
            if not self.at(")"):
                self.take(",")
        self.take(")")
        return tuple(args)

    def aggregation(self) -> _Node:
        op = self.take()[1]
        grouping = None
        if self.at("by", "without"):
            grouping = (self.take()[1], self.label_list())
        args = self.arguments()
        if self.at("by", "without"):
            grouping = (self.take()[1], self.label_list())
        if len(args) != 1:
            raise PromQLError(f"{op}() takes one argument here, got {len(args)}")
        return _intern(_Aggregate(op, args[0], grouping))

    def selector(self) -> _Node:
        matchers = []
        if self.peek()[0] == "ident":
            matchers.append(_Matcher(METRIC_NAME, "=", self.take()[1]))
        if self.at("{"):
            self.take("{")
            while not self.at("}"):
                name = self.take(kind="ident")[1]
                op = self.take()[1]
                if op not in ("=", "!=", "=~", "!~"):
                    raise PromQLError(f"label matcher {name}{op}: unknown operator")
                matchers.append(_Matcher(name, op, _unquote(self.take(kind="string")[1])))
                if not self.at("}"):
                    self.take(",")
            self.take("}")
        if not matchers:
            raise PromQLError(f"a selector needs a metric name or a matcher: {self.text!r}")
        token = self.peek()
        if token is not None and token[0] == "duration":
            self.i += 1
            spec = token[1].strip("[] ")
            return _intern(_Selector(tuple(matchers), float(spec[:-1]) * _DURATION_S[spec[-1]]))
        if self.at("offset"):
            raise PromQLError("offset is not supported")
        return _intern(_Selector(tuple(matchers), None))


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1])


# ---------------------------------------------------------------------------------------------- evaluation
class _Node:
    def eval(self, store: SeriesStore, t: float):
        """The node's value at t, computed once per time and set of samples (equal subtrees are one object)."""
        memo = store.memo_at(t)
        value = memo.get(id(self))
        if value is None:
            value = memo[id(self)] = self.compute(store, t)
        return value

    def compute(self, store: SeriesStore, t: float):
        raise NotImplementedError


@dataclass(frozen=True)
class _Number(_Node):
    value: float

    def compute(self, store, t):
        return Scalar(self.value)


@dataclass(frozen=True)
class _String(_Node):
    value: str

    def compute(self, store, t):
        return self.value


@dataclass(frozen=True)
class _Selector(_Node):
    matchers: tuple[_Matcher, ...]
    range_s: float | None

    def compute(self, store, t):
        if self.range_s is not None:
            raise PromQLError("a range selector is only allowed as rate()'s argument")
        out = []
        for series in store.select(self.matchers):
            # Newest sample in [t - lookback, t]; a staleness marker there hides the series.
            j = bisect.bisect_right(series.times, t) - 1
            if j >= 0 and series.times[j] >= t - LOOKBACK_S and series.values[j] is not None:
                out.append(Element(series.labels, series.values[j]))
        return out

    def range_samples(self, store: SeriesStore, t: float):
        """Per series: its labels without the name, and the times and values in [t - range, t]."""
        for series in store.select(self.matchers):
            lo = bisect.bisect_left(series.times, t - self.range_s)
            hi = bisect.bisect_right(series.times, t)
            times, values = series.times[lo:hi], series.values[lo:hi]
            if None in values:  # staleness markers are not samples
                kept = [(a, v) for a, v in zip(times, values, strict=True) if v is not None]
                times, values = [a for a, _ in kept], [v for _, v in kept]
            yield series.labels_without_name, times, values


def _drop_name(labels: Labels) -> Labels:
    return tuple(p for p in labels if p[0] != METRIC_NAME)


def extrapolated_rate(
    times: list[float], values: list[float], range_start: float, range_end: float, range_s: float
) -> float | None:
    """Prometheus' extrapolatedRate for a counter as rate(): per-second increase over the range, or None."""
    if len(values) < 2:
        return None
    first_t, first_v = times[0], values[0]
    last_t, last_v = times[-1], values[-1]
    result = last_v - first_v
    previous = first_v
    for value in values:
        if value < previous:  # a counter reset: the counter restarted from 0
            result += previous
        previous = value
    to_start = first_t - range_start
    to_end = range_end - last_t
    sampled = last_t - first_t
    average = sampled / (len(values) - 1)
    if result > 0 and first_v >= 0:
        # A counter is never negative: do not extrapolate to before the point where it would have been zero.
        to_zero = sampled * (first_v / result)
        if to_zero < to_start:
            to_start = to_zero
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    return result * (interval / sampled) / range_s


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' bucketQuantile over (upper bound, cumulative count) pairs."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets)
    if not buckets or not math.isinf(buckets[-1][0]):
        return math.nan
    coalesced: list[list[float]] = []
    for bound, count in buckets:  # series with the same bound (e.g. "1" and "1.0") are added up
        if coalesced and coalesced[-1][0] == bound:
            coalesced[-1][1] += count
        else:
            coalesced.append([bound, count])
    highest = -math.inf
    for bucket in coalesced:  # ensureMonotonic: a rate over buckets can dip by float error
        highest = max(highest, bucket[1])
        bucket[1] = highest
    if len(coalesced) < 2:
        return math.nan
    observations = coalesced[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(coalesced) - 1) if coalesced[i][1] >= rank), len(coalesced) - 1)
    if b == len(coalesced) - 1:
        return coalesced[-2][0]
    if b == 0 and coalesced[0][0] <= 0:
        return coalesced[0][0]
    start, end, count = 0.0, coalesced[b][0], coalesced[b][1]
    if b > 0:
        start = coalesced[b - 1][0]
        count -= coalesced[b - 1][1]
        rank -= coalesced[b - 1][1]
    return start + (end - start) * (rank / count)


@dataclass(frozen=True)
class _Call(_Node):
    name: str
    args: tuple[_Node, ...]

    def compute(self, store, t):
        if self.name == "rate":
            selector = self.args[0] if len(self.args) == 1 else None
            if not isinstance(selector, _Selector) or selector.range_s is None:
                raise PromQLError("rate() needs one range selector, e.g. rate(x[5m])")
            out = []
            for labels, times, values in selector.range_samples(store, t):
                value = extrapolated_rate(times, values, t - selector.range_s, t, selector.range_s)
                if value is not None:
                    out.append(Element(labels, value))
            return out
        if self.name == "histogram_quantile":
            q, vector = self._scalar(0, store, t), self._vector(1, store, t)
            groups: dict[Labels, list[tuple[float, float]]] = {}
            for e in vector:
                le = dict(e.labels).get("le")
                if le is None:
                    continue  # Prometheus ignores a series without `le` here
                key = tuple(p for p in e.labels if p[0] not in ("le", METRIC_NAME))
                groups.setdefault(key, []).append((float(le), e.value))
            return [Element(key, bucket_quantile(q, b)) for key, b in groups.items()]
        if self.name == "clamp_min":
            vector, floor = self._vector(0, store, t), self._scalar(1, store, t)
            return [
                Element(_drop_name(e.labels), e.value if math.isnan(e.value) else max(e.value, floor))
                for e in vector
            ]
        if self.name == "label_replace":
            vector = self._vector(0, store, t)
            dst, replacement, src, regex = (self.args[i].eval(store, t) for i in range(1, 5))
            pattern = re.compile(regex)
            template = re.sub(r"\$\{?(\w+)\}?", r"\\g<\1>", replacement)
            out = []
            for e in vector:
                labels = dict(e.labels)
                match = pattern.fullmatch(labels.get(src, ""))
                if match:
                    labels[dst] = match.expand(template)
                out.append(Element(labels_of(labels), e.value))
            return out
        raise PromQLError(f"function {self.name}() is not supported")

    def _vector(self, i, store, t) -> Vector:
        value = self.args[i].eval(store, t)
        if not isinstance(value, list):
            raise PromQLError(f"{self.name}(): argument {i + 1} must be an instant vector")
        return value

    def _scalar(self, i, store, t) -> float:
        value = self.args[i].eval(store, t)
        if not isinstance(value, Scalar):
            raise PromQLError(f"{self.name}(): argument {i + 1} must be a number")
        return value.value


@dataclass(frozen=True)
class _Aggregate(_Node):
    op: str
    arg: _Node
    grouping: tuple[str, tuple[str, ...]] | None

    def compute(self, store, t):
        vector = self.arg.eval(store, t)
        if not isinstance(vector, list):
            raise PromQLError(f"{self.op}() needs an instant vector")
        groups: dict[Labels, list[float]] = {}
        for e in vector:
            if self.grouping is None:
                key = ()
            elif self.grouping[0] == "by":
                key = tuple(p for p in e.labels if p[0] in self.grouping[1])
            else:
                key = tuple(p for p in e.labels if p[0] not in self.grouping[1] and p[0] != METRIC_NAME)
            groups.setdefault(key, []).append(e.value)
        return [Element(key, _aggregate(self.op, values)) for key, values in groups.items()]


def _aggregate(op: str, values: list[float]) -> float:
    if op == "sum":
        return math.fsum(values) if all(math.isfinite(v) for v in values) else sum(values)
    if op == "avg":
        return sum(values) / len(values)
    if op == "count":
        return float(len(values))
    # max/min: a NaN is replaced by any later number (aggregation in engine.go).
    best = values[0]
    for v in values[1:]:
        if math.isnan(best) or (v > best if op == "max" else v < best):
            best = v
    return best


def _arith(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
        return a / b
    if op == "%":
        return math.fmod(a, b) if b != 0 else math.nan
    if op == "^":
        return math.pow(a, b)
    raise PromQLError(f"operator {op} is not supported")


def _compare(op: str, a: float, b: float) -> bool:
    return {
        "==": a == b,
        "!=": a != b,
        ">": a > b,
        "<": a < b,
        ">=": a >= b,
        "<=": a <= b,
    }[op]


@dataclass(frozen=True)
class _Binary(_Node):
    op: str
    left: _Node
    right: _Node
    on: bool | None  # True: on(labels), False: ignoring(labels), None: neither
    labels: tuple[str, ...]

    def signature(self, labels: Labels) -> Labels:
        if self.on:
            return tuple(p for p in labels if p[0] in self.labels)
        return tuple(p for p in labels if p[0] != METRIC_NAME and p[0] not in self.labels)

    def compute(self, store, t):
        left, right = self.left.eval(store, t), self.right.eval(store, t)
        if self.op in _SET_OPS:
            if not (isinstance(left, list) and isinstance(right, list)):
                raise PromQLError(f"'{self.op}' needs instant vectors on both sides")
            right_sigs = {self.signature(e.labels) for e in right}
            if self.op == "and":
                return [e for e in left if self.signature(e.labels) in right_sigs]
            if self.op == "unless":
                return [e for e in left if self.signature(e.labels) not in right_sigs]
            left_sigs = {self.signature(e.labels) for e in left}
            return left + [e for e in right if self.signature(e.labels) not in left_sigs]
        comparison = self.op in _COMPARISONS
        if isinstance(left, Scalar) and isinstance(right, Scalar):
            if comparison:
                raise PromQLError("a comparison between two numbers needs 'bool', which is not supported")
            return Scalar(_arith(self.op, left.value, right.value))
        if isinstance(left, Scalar) or isinstance(right, Scalar):
            vector, scalar, vector_left = (
                (left, right.value, True) if isinstance(right, Scalar) else (right, left.value, False)
            )
            out = []
            for e in vector:
                a, b = (e.value, scalar) if vector_left else (scalar, e.value)
                if comparison:
                    if _compare(self.op, a, b):
                        out.append(e)  # a filter keeps the element as it is
                else:
                    out.append(Element(_drop_name(e.labels), _arith(self.op, a, b)))
            return out
        # One-to-one vector matching.
        by_sig: dict[Labels, Element] = {}
        for e in right:
            sig = self.signature(e.labels)
            if sig in by_sig:
                raise PromQLError(f"many-to-many matching for '{self.op}': two right-hand series share {sig}")
            by_sig[sig] = e
        out, seen = [], set()
        for e in left:
            sig = self.signature(e.labels)
            match = by_sig.get(sig)
            if match is None:
                continue
            if sig in seen:
                raise PromQLError(f"many-to-many matching for '{self.op}': two left-hand series share {sig}")
            seen.add(sig)
            labels = e.labels if comparison else _drop_name(e.labels)
            if self.on:
                labels = tuple(p for p in labels if p[0] in self.labels)
            elif self.on is False:
                labels = tuple(p for p in labels if p[0] not in self.labels)
            if comparison:
                if _compare(self.op, e.value, match.value):
                    out.append(Element(labels, e.value))
            else:
                out.append(Element(labels, _arith(self.op, e.value, match.value)))
        return out


# ---------------------------------------------------------------------------------------------- the API
class Query:
    """One parsed query, evaluated as an instant query at any time."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._root = _Parser(text).parse()

    def evaluate(self, store: SeriesStore, t: float) -> Scalar | Vector:
        result = self._root.eval(store, t)
        if isinstance(result, str):
            raise PromQLError(f"query {self.text!r} gives a string, not a number")
        return result

    def api_body(self, store: SeriesStore, t: float) -> dict:
        """The result as Prometheus' /api/v1/query answers it, for the shipped response parser."""
        result = self.evaluate(store, t)
        if isinstance(result, Scalar):
            return {
                "status": "success",
                "data": {"resultType": "scalar", "result": [t, _format(result.value)]},
            }
        series = [{"metric": dict(e.labels), "value": [t, _format(e.value)]} for e in result]
        return {"status": "success", "data": {"resultType": "vector", "result": series}}


def _format(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
