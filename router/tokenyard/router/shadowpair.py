"""Paired shadow comparison: a shadowed request's primary and its shadow copy, judged together once both ended.

Pure: no clocks, no I/O. Either side may end first; whichever ends last completes the pair (the client's stream
never waits for the shadow). For greedy requests (temperature 0) where both sides succeeded, the full output
texts (``openai_wire.OutputText``) are compared: a revision that answers the same prompts differently under
greedy decoding changed the model's behaviour, not only its speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIMARY, SHADOW = "primary", "shadow"
OUTCOMES = ("both_ok", "shadow_only_error", "primary_only_error", "both_error")


def pair_outcome(primary_ok: bool, shadow_ok: bool) -> str:
    if primary_ok and shadow_ok:
        return "both_ok"
    if primary_ok:
        return "shadow_only_error"
    if shadow_ok:
        return "primary_only_error"
    return "both_error"


@dataclass(frozen=True)
class PairResult:
    outcome: str  # one of OUTCOMES
    outputs_match: bool | None  # None: not compared (sampling, or a side failed)


@dataclass
class ShadowPair:
    """One shadowed request: ``greedy`` decides whether the outputs are compared; the names say whose pair it
    is (the shadow's revision)."""

    greedy: bool
    namespace: str = ""
    model: str = ""
    revision: str = ""
    _ended: dict[str, tuple[bool | None, str | None]] = field(default_factory=dict)

    def end(self, side: str, ok: bool | None, text: str | None = None) -> PairResult | None:
        """Record how one side ended; returns the pair's result when this was the last side to end, else
        None. A side that ends twice keeps its first ending (the pair is counted once). ``ok=None`` is an
        ending that says nothing of the revision (the client went away): the pair is not counted at all,
        since counting it as the stable side's failure would favour the canary."""
        if side not in (PRIMARY, SHADOW):
            raise ValueError(f"side must be {PRIMARY!r} or {SHADOW!r}, got {side!r}")
        if side in self._ended or len(self._ended) == 2:
            return None
        self._ended[side] = (ok, text)
        if len(self._ended) < 2:
            return None
        (primary_ok, primary_text), (shadow_ok, shadow_text) = self._ended[PRIMARY], self._ended[SHADOW]
        if primary_ok is None or shadow_ok is None:
            return None
        match = None
        if self.greedy and primary_ok and shadow_ok and primary_text is not None and shadow_text is not None:
            match = primary_text == shadow_text
        return PairResult(pair_outcome(primary_ok, shadow_ok), match)
