"""What a replica reports about itself on /metrics, for vLLM and SGLang, and when that report is stale.

The router reads a handful of series from an engine's Prometheus endpoint: KV-cache occupancy, waiting and
running requests, prefix-cache counters and the cache geometry. Each engine names them its own way:

| signal             | vLLM (v0.13.0, vllm/v1/metrics/loggers.py)            | SGLang (python/sglang/srt/metrics/collector.py) |
|--------------------|-------------------------------------------------------|-------------------------------------------------|
| KV occupancy 0..1  | vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc   | sglang:token_usage                              |
|                    | before 0.9.2, removed in 0.12)                        |                                                 |
| waiting requests   | vllm:num_requests_waiting                             | sglang:num_queue_reqs                           |
| running requests   | vllm:num_requests_running                             | sglang:num_running_reqs                         |
| prefix hits (tok)  | vllm:prefix_cache_hits_total                          | sglang:cached_tokens_total                      |
| prefix queries     | vllm:prefix_cache_queries_total                       | sglang:prompt_tokens_total                      |
| prefix hit ratio   | (none: derive from the counters)                      | sglang:cache_hit_rate (a gauge, recent batches) |
| block / page size  | vllm:cache_config_info{block_size}                    | sglang:page_size                                |
| capacity           | vllm:cache_config_info{kv_cache_size_tokens} (tokens, | sglang:max_total_num_tokens (tokens),           |
|                    | since #42206), else {num_gpu_blocks} x {block_size}   | sglang:num_pages (pages)                        |

vLLM labels every series with ``model_name`` and ``engine`` (the data-parallel engine index); its info gauge
``vllm:cache_config_info`` carries CacheConfig.metrics_info() as labels plus ``engine``, no ``model_name``.
SGLang labels scheduler series with ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``
(plus ``dp_rank`` with data-parallel attention, and ``priority`` with priority scheduling: the total has
``priority=""`` and each priority adds its own breakdown series, which must not be added to the total).
``sglang:page_size``/``sglang:num_pages`` exist only in recent SGLang (emit_constants); older releases export
``sglang:max_total_num_tokens`` alone, and the page size then stays unknown (SGLang's default page is 1 token).

Aggregation: breakdown series (``priority`` not empty) are dropped; series that differ only in a rank or
process label (tp/pp/moe_ep: ranks of one scheduler reporting the same state, e.g. with SGLang's
--enable-metrics-for-all-schedulers; ``pid``: one copy per process of a multiprocess Prometheus client) are
reduced to their maximum; what remains (several data-parallel engines,
several models) is summed for counts, counters and capacity and averaged for ratios. NaN and infinite samples
say nothing and are ignored. When the replica is known to serve particular model names and the payload labels
series with ``model_name``, only those models' series are read (an endpoint fronting several engines); if none
matches (a static backend whose engine names its model differently), all are read.

The parser is a line scanner for the wanted names, not a full exposition-format parser: an engine exports
hundreds of histogram lines and the router scrapes every replica every couple of seconds. It accepts the
Prometheus text format (0.0.4) and OpenMetrics (``# EOF``; counter samples ``foo_total`` with ``foo_created``
beside them, which is never read as the value), labels in any order, extra labels, escaped label values,
timestamps and exemplars after the value, and the underscore-escaped names (``vllm_num_requests_waiting``)
prometheus_client writes in OpenMetrics. Bodies arrive gzip- or deflate-compressed from Go and Python
Prometheus clients alike (both compress when the request accepts gzip): see ``decode_metrics_body``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from tokenyard.core.metrics import REQUESTS_RUNNING, REQUESTS_WAITING, vllm_kv_capacity_tokens, whole_number

# A decompressed /metrics body larger than this is refused (a real engine's is well under 1 MiB).
MAX_METRICS_BYTES = 32 * 1024 * 1024
GZIP_MAGIC = b"\x1f\x8b"


class MetricsError(ValueError):
    """A /metrics body the router cannot read; ``reason`` is a bounded label value (decode, parse)."""

    reason = "parse"


class MetricsDecodeError(MetricsError):
    reason = "decode"


class MetricsParseError(MetricsError):
    reason = "parse"


@dataclass(frozen=True)
class EngineStats:
    scraped_at: float
    kv_usage: float | None = None  # KV-cache occupancy, 0..1
    waiting: float | None = None  # requests waiting in the engine's scheduler queue
    running: float | None = None  # requests in the running batch
    block_size: int | None = None  # tokens per KV block (vLLM) or page (SGLang)
    num_gpu_blocks: int | None = None  # KV capacity in those blocks/pages
    prefix_hits: float | None = None  # cumulative prompt tokens served from the prefix cache
    prefix_queries: float | None = None  # cumulative prompt tokens looked up in it
    prefix_hit_rate: float | None = None  # the engine's own recent hit ratio (SGLang), 0..1
    kv_capacity_tokens: int | None = None  # KV capacity in tokens
    engine: str | None = None  # "vllm" or "sglang": whose names the payload used; None if neither

    def fresh(self, now: float, max_age_s: float) -> bool:
        return now - self.scraped_at <= max_age_s


# --- the names ----------------------------------------------------------------------------------------------

VLLM_CACHE_INFO = "vllm:cache_config_info"
# signal -> names in order of preference (the first present wins; vLLM 0.9-0.11 export both usage names)
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
_WAITING = REQUESTS_WAITING
_RUNNING = REQUESTS_RUNNING
_PREFIX_HITS = ("vllm:prefix_cache_hits", "sglang:cached_tokens")
_PREFIX_QUERIES = ("vllm:prefix_cache_queries", "sglang:prompt_tokens")
_HIT_RATE = ("sglang:cache_hit_rate",)
_PAGE_SIZE = "sglang:page_size"
_NUM_PAGES = "sglang:num_pages"
_MAX_TOKENS = "sglang:max_total_num_tokens"
# Counter families: the sample is family + "_total" (text format from prometheus_client, OpenMetrics), or the
# bare family name (a Go client's classic text format may expose a counter without the suffix).
_COUNTERS = (*_PREFIX_HITS, *_PREFIX_QUERIES)
_GAUGES = (*_KV_USAGE, *_WAITING, *_RUNNING, *_HIT_RATE, _PAGE_SIZE, _NUM_PAGES, _MAX_TOKENS)
_RATIOS = frozenset((*_KV_USAGE, *_HIT_RATE))  # averaged across series; everything else is summed

# sample name as written -> family; both the colon form and prometheus_client's OpenMetrics underscore form
_SAMPLE_FAMILY: dict[str, str] = {}
for _family in (*_GAUGES, VLLM_CACHE_INFO):
    _SAMPLE_FAMILY[_family] = _family
for _family in _COUNTERS:
    _SAMPLE_FAMILY[_family + "_total"] = _family
    _SAMPLE_FAMILY[_family] = _family
for _name, _family in list(_SAMPLE_FAMILY.items()):
    _SAMPLE_FAMILY[_name.replace(":", "_", 1)] = _family
# line prefixes worth a closer look (str.startswith with a tuple runs in C: most lines fail it at once)
_PREFIXES = tuple(sorted(_SAMPLE_FAMILY))

# Labels whose series are copies of one state, reduced to their maximum: SGLang's ranks of one scheduler, and
# `pid`, which prometheus_client's multiprocess mode adds to a gauge of mode "all" per process (vLLM with
# --api-server-count > 1 exported vllm:kv_cache_usage_perc so until vllm-project/vllm#28792: the recording
# process's value beside a 0 from every other one).
_COPY_LABELS = frozenset(("tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_cp_rank", "pid"))


# --- bytes -> text ------------------------------------------------------------------------------------------


def _inflate(data: bytes, wbits: int, what: str) -> bytes:
    decompressor = zlib.decompressobj(wbits)
    try:
        out = decompressor.decompress(data, MAX_METRICS_BYTES + 1)
    except zlib.error as error:
        raise MetricsDecodeError(f"body is not valid {what} data: {error}") from None
    if len(out) > MAX_METRICS_BYTES or decompressor.unconsumed_tail:
        raise MetricsDecodeError(f"{what} body inflates beyond {MAX_METRICS_BYTES} bytes")
    if not decompressor.eof:
        raise MetricsDecodeError(f"body is not valid {what} data: truncated after {len(data)} bytes")
    return out


def _gunzip(data: bytes) -> bytes:
    return _inflate(data, 16 + zlib.MAX_WBITS, "gzip")


def _looks_like_zlib(data: bytes) -> bool:
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


def decode_metrics_body(body: bytes, content_encoding: str | None = None) -> str:
    """The text of a /metrics response body, whatever its ``Content-Encoding`` (gzip, x-gzip, deflate,
    identity; several are undone in reverse order) and also when it is gzip without saying so (the gzip
    magic bytes). Raises MetricsDecodeError naming what was wrong.

    A declared encoding whose bytes do not look encoded is taken as already decoded (a proxy or a client
    that decompressed the body but kept the header); the UTF-8 check that follows still guards it."""
    data = bytes(body)
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    for coding in reversed(codings):
        if coding in ("gzip", "x-gzip"):
            if data.startswith(GZIP_MAGIC):
                data = _gunzip(data)
        elif coding == "deflate":
            # RFC 9110 says zlib-wrapped; some servers send raw deflate. Plain text is neither.
            if _looks_like_zlib(data):
                data = _inflate(data, zlib.MAX_WBITS, "deflate")
            elif data and not _is_text(data[:64]):
                data = _inflate(data, -zlib.MAX_WBITS, "raw deflate")
        elif coding != "identity":
            raise MetricsDecodeError(f"unsupported Content-Encoding {coding!r} (the router asks for gzip)")
    if data.startswith(GZIP_MAGIC):  # gzip without the header, or gzip twice
        data = _gunzip(data)
    if len(data) > MAX_METRICS_BYTES:
        raise MetricsDecodeError(f"body is larger than {MAX_METRICS_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        sample = data[max(0, error.start - 8) : error.start + 8]
        raise MetricsDecodeError(
            f"body is neither UTF-8 text nor gzip/deflate: invalid byte at offset {error.start} "
            f"(near {sample!r})"
        ) from None


def _is_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        return error.start >= len(head) - 3  # a multi-byte character cut by the slice
    return all(b >= 0x20 or b in (0x09, 0x0A, 0x0D) for b in head)


# --- text -> samples -----------------------------------------------------------------------------------------

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(line: str, start: int, lineno: int) -> tuple[dict[str, str], int]:
    """Labels from ``line[start] == '{'``; returns them and the index after the closing brace."""
    labels: dict[str, str] = {}
    i, n = start + 1, len(line)
    while True:
        while i < n and line[i] in " \t,":
            i += 1
        if i >= n:
            raise MetricsParseError(f"line {lineno}: unterminated label set: {line[:120]!r}")
        if line[i] == "}":
            return labels, i + 1
        eq = line.find("=", i)
        if eq < 0:
            raise MetricsParseError(f"line {lineno}: label without '=': {line[:120]!r}")
        name = line[i:eq].strip()
        if name.startswith('"') and name.endswith('"') and len(name) >= 2:
            name = name[1:-1]  # quoted label names (UTF-8 names in the newest exposition formats)
        i = eq + 1
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != '"':
            raise MetricsParseError(f"line {lineno}: label {name!r} has no quoted value: {line[:120]!r}")
        i += 1
        value: list[str] = []
        while True:
            quote = line.find('"', i)
            slash = line.find("\\", i, quote if quote >= 0 else n)
            if quote < 0:
                raise MetricsParseError(f"line {lineno}: unterminated value of label {name!r}")
            if slash < 0:
                value.append(line[i:quote])
                i = quote + 1
                break
            value.append(line[i:slash])
            if slash + 1 >= n:
                raise MetricsParseError(f"line {lineno}: dangling escape in label {name!r}")
            escaped = line[slash + 1]
            value.append(_ESCAPES.get(escaped, "\\" + escaped))
            i = slash + 2
        labels[name] = "".join(value)


def _parse_value(rest: str, lineno: int, line: str) -> float:
    fields = rest.split()
    if not fields:
        raise MetricsParseError(f"line {lineno}: sample without a value: {line[:120]!r}")
    try:
        return float(fields[0])  # accepts NaN, +Inf, -Inf and exponents; a timestamp or exemplar may follow
    except ValueError:
        raise MetricsParseError(f"line {lineno}: value {fields[0][:40]!r} is not a number") from None


def _samples(text: str) -> tuple[list[tuple[str, dict[str, str], float]], bool]:
    """The wanted samples (family, labels, value), and whether the text looked like an exposition at all."""
    found: list[tuple[str, dict[str, str], float]] = []
    exposition = False
    # Lines end at "\n" only (str.splitlines would also cut at form feeds and other separators inside values).
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line or line == "\r":
            continue
        first = line[0]
        if first == "#":
            if not exposition and line.startswith(("# TYPE ", "# HELP ", "# EOF", "# UNIT ")):
                exposition = True
            continue
        if first == "{":  # a quoted metric name inside the braces: {"vllm:num_requests_waiting",a="b"} 1
            close = line.find('"', 2)
            if close < 0 or line[1] != '"':
                continue
            family = _SAMPLE_FAMILY.get(line[2:close])
            if family is None:
                continue
            rebuilt = "{" + line[close + 1 :].lstrip(" \t,")
            labels, end = _parse_labels(rebuilt, 0, lineno)
            found.append((family, labels, _parse_value(rebuilt[end:], lineno, line)))
            continue
        if not line.startswith(_PREFIXES):
            continue
        end = len(line)
        for stop in ("{", " ", "\t"):
            at = line.find(stop)
            if 0 <= at < end:
                end = at
        family = _SAMPLE_FAMILY.get(line[:end])
        if family is None:  # a longer name sharing a prefix (vllm:num_requests_waiting_by_reason, _created)
            continue
        rest_at = end
        while rest_at < len(line) and line[rest_at] in " \t":
            rest_at += 1
        labels: dict[str, str] = {}
        if rest_at < len(line) and line[rest_at] == "{":
            labels, rest_at = _parse_labels(line, rest_at, lineno)
        found.append((family, labels, _parse_value(line[rest_at:], lineno, line)))
    return found, exposition or bool(found)


# --- samples -> stats ---------------------------------------------------------------------------------------


def _reduce(series: Iterable[tuple[dict[str, str], float]], ratio: bool) -> float | None:
    """Copies of one state (ranks of a scheduler, processes of a server) -> their maximum; the rest summed
    (counts) or averaged (ratios)."""
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in series:
        if not math.isfinite(value):
            continue
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in _COPY_LABELS))
        previous = groups.get(key)
        groups[key] = value if previous is None else max(previous, value)
    if not groups:
        return None
    total = math.fsum(groups.values())
    return total / len(groups) if ratio else total


def _whole(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) and value >= 1 else None


def parse_engine_metrics(text: str, scraped_at: float, models: Collection[str] = ()) -> EngineStats:
    """Parse a /metrics body of vLLM or SGLang into the signals the router reads (see the module docstring).

    ``models``: the model names the router serves from this replica; when given and the payload labels
    series by ``model_name``, other models' series are ignored. Raises MetricsParseError when the body is
    not a Prometheus exposition or a wanted line is malformed. A valid exposition with none of the known
    names (an engine with its own names) gives stats with every signal unknown."""
    samples, exposition = _samples(text)
    if not exposition:
        head = text.lstrip()[:60]
        raise MetricsParseError(
            "body is not a Prometheus exposition: no # HELP/# TYPE line and no known series"
            + (f" (it starts {head!r})" if head else " (it is empty)")
        )
    if models:
        served = set(models)
        if any(labels.get("model_name") in served for _, labels, _ in samples):
            samples = [s for s in samples if "model_name" not in s[1] or s[1]["model_name"] in served]

    by_family: dict[str, list[tuple[dict[str, str], float]]] = {}
    cache_info: list[dict[str, str]] = []
    for family, labels, value in samples:
        if labels.get("priority"):  # SGLang's per-priority breakdown of a total that is also exported
            continue
        if family == VLLM_CACHE_INFO:
            cache_info.append(labels)
        else:
            by_family.setdefault(family, []).append((labels, value))

    def signal(names: tuple[str, ...]) -> float | None:
        for name in names:
            if name in by_family:
                value = _reduce(by_family[name], name in _RATIOS)
                if value is not None:
                    return value
        return None

    block_size = num_blocks = capacity = None
    engine = None
    if cache_info:
        engine = "vllm"
        sizes = [s for s in (whole_number(labels.get("block_size")) for labels in cache_info) if s]
        by_engine = {labels.get("engine", ""): labels for labels in cache_info}
        block_size = max(sizes) if sizes else None
        known = [
            b for b in (whole_number(labels.get("num_gpu_blocks")) for labels in by_engine.values()) if b
        ]
        num_blocks = sum(known) if known else None
        # Each engine's own size (kv_cache_size_tokens where vLLM states it: core.metrics says why the
        # product of blocks and block size is wrong for hybrid models), summed over data-parallel engines.
        capacities = [c for c in map(vllm_kv_capacity_tokens, by_engine.values()) if c]
        capacity = sum(capacities) if capacities else None
    # SGLang's geometry: page size in tokens, capacity in tokens and (recent releases) in pages
    page_size = _whole(max((v for _, v in by_family.get(_PAGE_SIZE, ()) if math.isfinite(v)), default=None))
    sglang_tokens = _whole(signal((_MAX_TOKENS,)))
    sglang_pages = _whole(signal((_NUM_PAGES,)))
    if block_size is None:
        block_size = page_size
    if capacity is None:
        capacity = sglang_tokens or (sglang_pages * page_size if sglang_pages and page_size else None)
    if num_blocks is None:
        num_blocks = sglang_pages or (capacity // page_size if capacity and page_size else None)
    if engine is None:
        families = {family.split(":", 1)[0] for family in by_family}
        engine = "vllm" if "vllm" in families else "sglang" if "sglang" in families else None
    return EngineStats(
        scraped_at=scraped_at,
        kv_usage=signal(_KV_USAGE),
        waiting=signal(_WAITING),
        running=signal(_RUNNING),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        prefix_hits=signal(_PREFIX_HITS),
        prefix_queries=signal(_PREFIX_QUERIES),
        prefix_hit_rate=signal(_HIT_RATE),
        kv_capacity_tokens=capacity,
        engine=engine,
    )
