"""Load accounting (outstanding tokens per replica) and passive failure ejection. Pure: no clocks, no I/O.

A request adds its prompt tokens the replica has not cached (work still to prefill) plus its expected decode
tokens when it is routed. The prefill part is released when the first token arrives, decode tokens as they
stream, and whatever remains when the request ends - on success, error, timeout or client disconnect alike
(a counter that is only released on success drifts; see skypilot-org/skypilot#10444).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Ticket:
    """One routed request's share of a replica's load."""

    id: int
    replica: str
    prefill_left: int
    decode_left: int
    closed: bool = False

    @property
    def tokens_left(self) -> int:
        return self.prefill_left + self.decode_left


@dataclass
class ReplicaLoad:
    tokens: int = 0
    requests: int = 0


class LoadLedger:
    """Outstanding tokens and requests per replica, counted by this router."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._loads: dict[str, ReplicaLoad] = defaultdict(ReplicaLoad)
        self._open: dict[int, Ticket] = {}

    def open(self, replica: str, prefill_tokens: int, decode_tokens: int) -> Ticket:
        if prefill_tokens < 0 or decode_tokens < 0:
            raise ValueError(
                f"token counts must be >= 0, got prefill={prefill_tokens} decode={decode_tokens}"
            )
        ticket = Ticket(next(self._ids), replica, prefill_tokens, decode_tokens)
        load = self._loads[replica]
        load.tokens += ticket.tokens_left
        load.requests += 1
        self._open[ticket.id] = ticket
        return ticket

    def first_token(self, ticket: Ticket) -> None:
        """The prompt is prefilled: release its prefill share."""
        if ticket.closed or ticket.prefill_left == 0:
            return
        self._loads[ticket.replica].tokens -= ticket.prefill_left
        ticket.prefill_left = 0

    def generated(self, ticket: Ticket, tokens: int) -> None:
        """``tokens`` more output tokens streamed (the first one also ends the prefill)."""
        if ticket.closed or tokens <= 0:
            return
        self.first_token(ticket)
        released = min(tokens, ticket.decode_left)
        ticket.decode_left -= released
        self._loads[ticket.replica].tokens -= released

    def close(self, ticket: Ticket) -> None:
        """The request ended, however it ended; safe to call more than once."""
        if ticket.closed:
            return
        load = self._loads[ticket.replica]
        load.tokens -= ticket.tokens_left
        load.requests -= 1
        ticket.prefill_left = ticket.decode_left = 0
        ticket.closed = True
        del self._open[ticket.id]
        if load.requests == 0 and load.tokens == 0:
            del self._loads[ticket.replica]

    def load(self, replica: str) -> ReplicaLoad:
        found = self._loads.get(replica)
        return ReplicaLoad(found.tokens, found.requests) if found else ReplicaLoad()

    def snapshot(self) -> dict[str, ReplicaLoad]:
        return {name: ReplicaLoad(load.tokens, load.requests) for name, load in self._loads.items()}

    def open_tickets(self) -> int:
        return len(self._open)


@dataclass
class EjectionPolicy:
    """Eject a replica after ``consecutive_failures`` failures in a row, for ``base_s`` doubling on each
    ejection in a row up to ``max_s``; one success resets both counts."""

    consecutive_failures: int = 3
    base_s: float = 5.0
    max_s: float = 60.0


@dataclass
class _FailureState:
    consecutive: int = 0
    ejections_in_a_row: int = 0
    ejected_until: float = 0.0


@dataclass
class FailureTracker:
    policy: EjectionPolicy = field(default_factory=EjectionPolicy)
    _states: dict[str, _FailureState] = field(default_factory=dict)

    def record_success(self, replica: str) -> None:
        self._states.pop(replica, None)

    def record_failure(self, replica: str, now: float) -> bool:
        """Counts a failure; returns True when this failure ejects the replica."""
        state = self._states.setdefault(replica, _FailureState())
        state.consecutive += 1
        if state.consecutive < self.policy.consecutive_failures or state.ejected_until > now:
            return False
        state.ejections_in_a_row += 1
        duration = min(self.policy.max_s, self.policy.base_s * 2 ** (state.ejections_in_a_row - 1))
        state.ejected_until = now + duration
        state.consecutive = 0
        return True

    def is_ejected(self, replica: str, now: float) -> bool:
        state = self._states.get(replica)
        return state is not None and state.ejected_until > now

    def forget(self, replica: str) -> None:
        self._states.pop(replica, None)
