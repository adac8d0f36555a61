"""The rollout state machine: from the strategy, the current state and what is observed, the next state and
what to do (a pure core: no clocks, no I/O; ``now`` is an argument).

The operator calls ``step(strategy, state, observations, now)`` on every reconcile and applies the actions
it returns; the whole rollout lives in ``RolloutState``, which round-trips through ``to_dict``/``from_dict``
into the ModelDeployment's status, so an operator killed at any point resumes at the same step.

The actions are level-based: every call returns the full desired traffic split, the shadow fraction and
the group count of every revision that should have groups (the adapter patches only what differs). The
one-off ``PromoteRevision`` and ``RemoveGroups`` name the moment of a change, but the state carries the same
facts (``stable_revision``; revisions absent from the ``ScaleGroups`` actions), so an adapter that crashed
between persisting the state and acting converges anyway: it sets the current revision to
``state.stable_revision`` and removes the groups of any revision no ``ScaleGroups`` names.

Rules this machine keeps (and the property tests check):

* Traffic weight (and shadow traffic) goes only to a revision with at least one ready group; a weight step
  waits until the canary has the groups that weight needs.
* The stable revision keeps its full group count until the canary is promoted, and the canary receives
  all traffic only once all its groups are ready.
* Rollback (failed analysis or ``abort``) sets the canary's weight and shadow to 0 at once; its groups are
  removed only after ``drain_timeout_s`` so that the streams in flight finish. Promotion drains the old
  stable revision the same way.
* An inconclusive analysis pauses with the reason: it neither rolls back nor promotes; the rollout resumes
  by itself once the analysis can judge again.
* Every rollout ends in ``Healthy`` or ``RolledBack``: pauses until promoted need a ``promote``, and a
  canary whose groups never become ready is rolled back after ``progress_deadline_s``.

Steps follow Argo Rollouts' canary steps in spirit (setWeight, pause, analysis) plus a shadow step.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tokenyard.operator.analysis import AnalysisDecision

__all__ = [
    "AnalysisStep",
    "Command",
    "CommandKind",
    "Observations",
    "PauseReason",
    "PauseStep",
    "Phase",
    "PromoteRevision",
    "RemoveGroups",
    "RolloutDecision",
    "RolloutState",
    "ScaleGroups",
    "SetShadow",
    "SetWeightStep",
    "SetWeights",
    "ShadowStep",
    "Strategy",
    "analysis_look_due",
    "analysis_window",
    "last_analysis",
    "start_rollout",
    "step",
]


class Phase(enum.StrEnum):
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    PROMOTING = "Promoting"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    HEALTHY = "Healthy"

    @property
    def terminal(self) -> bool:
        return self in (Phase.HEALTHY, Phase.ROLLED_BACK)


class PauseReason(enum.StrEnum):
    USER = "PausedByUser"  # `pause`; `resume` continues, the step clock does not run meanwhile
    STEP = "WaitingForPromote"  # a pause step without a duration; `promote` (or `resume`) continues
    INCONCLUSIVE = "AnalysisInconclusive"  # continues by itself once the analysis can judge again
    ANALYSIS_FAILED = "AnalysisFailed"  # failed with autoRollback off; `abort` or `promote` decides


# --- the strategy --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SetWeightStep:
    weight: int  # percent of traffic to the canary


@dataclass(frozen=True)
class PauseStep:
    duration_s: float | None  # None: until promoted


@dataclass(frozen=True)
class ShadowStep:
    """Copy ``fraction`` of live requests to the canary for ``duration_s``; with ``analysis`` the step also
    waits for the paired analysis to pass."""

    fraction: float
    duration_s: float
    analysis: bool = True


@dataclass(frozen=True)
class AnalysisStep:
    """Run the analysis for ``duration_s`` (the window); the step ends when it passes (an early PASS ends it
    sooner). ``metrics`` is the metric configuration, read by the adapter that runs the analysis."""

    duration_s: float
    metrics: tuple[Mapping, ...] = ()


Step = SetWeightStep | PauseStep | ShadowStep | AnalysisStep


@dataclass(frozen=True)
class Strategy:
    """``ModelDeployment.spec.rollout`` in plain form, with the desired number of groups."""

    steps: tuple[Step, ...]
    replicas: int  # groups of the stable revision (and of the canary once promoted)
    max_surge: int | None = None  # most canary groups before promotion; None: as many as the weight needs
    drain_timeout_s: float = 60.0
    progress_deadline_s: float = 600.0  # waiting this long for canary groups to be ready rolls back
    auto_rollback: bool = True
    analysis_interval_s: float = 0.0  # least time between two looks of the analysis (0: every reconcile)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be ≥ 1 for a rollout, got {self.replicas!r}")
        if self.max_surge is not None and self.max_surge < 1:
            raise ValueError(f"rollout.maxSurge must be ≥ 1 group, got {self.max_surge!r}")

    def canary_groups_for(self, weight: int) -> int:
        """Groups the canary needs to carry ``weight`` percent of the traffic (at least one while a
        rollout runs, so that shadow copies and the first weight have somewhere to go)."""
        needed = max(1, math.ceil(weight * self.replicas / 100))
        return needed if self.max_surge is None else min(needed, self.max_surge)


# --- state, observations, actions ---------------------------------------------------------------------


class CommandKind(enum.StrEnum):
    PROMOTE = "promote"  # skip the current step
    PROMOTE_FULL = "promote-full"  # skip every remaining step
    ABORT = "abort"
    PAUSE = "pause"
    RESUME = "resume"


@dataclass(frozen=True)
class Command:
    kind: CommandKind
    id: str  # unique per command, so that a command seen again after a restart is not applied twice


_REMEMBERED_COMMANDS = 16


@dataclass(frozen=True)
class RolloutState:
    stable_revision: str
    phase: Phase = Phase.HEALTHY
    canary_revision: str | None = None
    step_index: int = 0
    step_started_at: float | None = None  # None: the step waits for its preconditions
    waiting_since: float | None = None  # since when the step has waited for canary groups
    canary_weight: int = 0  # percent of traffic the canary is meant to get
    shadow_fraction: float = 0.0
    pause_reason: PauseReason | None = None
    paused_at: float | None = None
    draining_revision: str | None = None  # old stable after promotion, or the canary on rollback
    drain_started_at: float | None = None
    rolled_back_revision: str | None = None
    message: str = ""  # the reason for the last transition
    handled_commands: tuple[str, ...] = ()
    # The analysis' last look: when, and its verdict, which stands until the next look is due. Kept in the
    # status so that an operator restart neither looks early nor forgets the verdict.
    analysis_looked_at: float | None = None
    analysis_decision: AnalysisDecision | None = None
    analysis_reason: str = ""

    def to_dict(self) -> dict:
        return {
            "phase": str(self.phase),
            "stableRevision": self.stable_revision,
            "canaryRevision": self.canary_revision,
            "stepIndex": self.step_index,
            "stepStartedAt": self.step_started_at,
            "waitingSince": self.waiting_since,
            "canaryWeight": self.canary_weight,
            "shadowFraction": self.shadow_fraction,
            "pauseReason": None if self.pause_reason is None else str(self.pause_reason),
            "pausedAt": self.paused_at,
            "drainingRevision": self.draining_revision,
            "drainStartedAt": self.drain_started_at,
            "rolledBackRevision": self.rolled_back_revision,
            "message": self.message,
            "handledCommands": list(self.handled_commands),
            "analysisLookedAt": self.analysis_looked_at,
            "analysisDecision": None if self.analysis_decision is None else str(self.analysis_decision),
            "analysisReason": self.analysis_reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> RolloutState:
        try:
            pause = data.get("pauseReason")
            analysis = data.get("analysisDecision")
            return cls(
                stable_revision=data["stableRevision"],
                phase=Phase(data.get("phase", Phase.HEALTHY)),
                canary_revision=data.get("canaryRevision"),
                step_index=int(data.get("stepIndex", 0)),
                step_started_at=data.get("stepStartedAt"),
                waiting_since=data.get("waitingSince"),
                canary_weight=int(data.get("canaryWeight", 0)),
                shadow_fraction=float(data.get("shadowFraction", 0.0)),
                pause_reason=None if pause is None else PauseReason(pause),
                paused_at=data.get("pausedAt"),
                draining_revision=data.get("drainingRevision"),
                drain_started_at=data.get("drainStartedAt"),
                rolled_back_revision=data.get("rolledBackRevision"),
                message=data.get("message", ""),
                handled_commands=tuple(data.get("handledCommands", ())),
                analysis_looked_at=data.get("analysisLookedAt"),
                analysis_decision=None if analysis is None else AnalysisDecision(analysis),
                analysis_reason=data.get("analysisReason", ""),
            )
        except (KeyError, ValueError, TypeError) as error:
            raise ValueError(
                f"status.rollout is not a valid rollout state ({error!r}): {dict(data)!r}"
            ) from error


@dataclass(frozen=True)
class Observations:
    """What the adapter saw. Ready groups are keyed by revision (not by role: roles swap at promotion)."""

    ready_groups: Mapping[str, int]
    analysis: AnalysisDecision | None = None  # verdict of the analysis running now (None: none is running)
    analysis_reason: str = ""
    commands: tuple[Command, ...] = ()
    analysis_at: float | None = None  # when that verdict was reached (a look), if it is a new one


@dataclass(frozen=True)
class SetWeights:
    weights: dict[str, int]  # percent per revision; the router splits among the positive ones


@dataclass(frozen=True)
class SetShadow:
    revision: str | None
    fraction: float


@dataclass(frozen=True)
class ScaleGroups:
    revision: str
    groups: int


@dataclass(frozen=True)
class RemoveGroups:
    revision: str  # its traffic has drained: delete its groups


@dataclass(frozen=True)
class PromoteRevision:
    revision: str  # becomes the stable (current) revision


Action = SetWeights | SetShadow | ScaleGroups | RemoveGroups | PromoteRevision


@dataclass(frozen=True)
class RolloutDecision:
    state: RolloutState
    actions: tuple[Action, ...]
    reason: str  # why things are as they are now (the last transition's reason is state.message)
    events: tuple[str, ...] = field(default=())  # transitions made in this call, for Kubernetes events


# --- entry points --------------------------------------------------------------------------------------


def start_rollout(state: RolloutState, new_revision: str, now: float) -> RolloutState:
    """Begin rolling ``new_revision`` out over the stable revision (from a finished rollout only)."""
    if not state.phase.terminal:
        raise ValueError(
            f"cannot start a rollout of {new_revision} while the rollout of {state.canary_revision} is "
            f"{state.phase}; abort it or let it finish first"
        )
    if new_revision == state.stable_revision:
        raise ValueError(f"revision {new_revision} is already the stable revision")
    return RolloutState(
        stable_revision=state.stable_revision,
        phase=Phase.PROGRESSING,
        canary_revision=new_revision,
        step_index=0,
        message=f"rollout of {new_revision} started",
        handled_commands=state.handled_commands,
        waiting_since=now,
    )


def analysis_window(strategy: Strategy, state: RolloutState, now: float) -> tuple[float, bool] | None:
    """For the adapter: (start of the current analysis window, whether the window has ended), or None when
    the current step runs no analysis."""
    if state.phase not in (Phase.PROGRESSING, Phase.PAUSED) or state.step_started_at is None:
        return None
    current = strategy.steps[state.step_index] if state.step_index < len(strategy.steps) else None
    if isinstance(current, AnalysisStep) or (isinstance(current, ShadowStep) and current.analysis):
        return state.step_started_at, now >= state.step_started_at + current.duration_s
    return None


def analysis_look_due(strategy: Strategy, state: RolloutState, now: float) -> bool:
    """For the adapter, while ``analysis_window`` is open: should the analysis look now?

    Yes for the first look of a window, once ``analysis_interval_s`` has passed since the last look (also
    after the window ended, while an inconclusive final look keeps the rollout paused), and for the final
    look when the window ends (the one that may pass the canary). In between, the adapter passes on
    ``last_analysis`` instead. The sequential test stays valid however often it looks; the interval
    bounds the load on Prometheus and is the cadence users configured.
    """
    window = analysis_window(strategy, state, now)
    if window is None:
        return False
    start, over = window
    looked = state.analysis_looked_at
    # A look at the window's very start came from the step before (its verdict started this one).
    first = looked is None or looked <= start
    final = over and not first and looked < start + strategy.steps[state.step_index].duration_s
    return first or final or now - looked >= strategy.analysis_interval_s


def last_analysis(state: RolloutState) -> tuple[AnalysisDecision | None, str]:
    """The verdict of the last look, standing until the next one."""
    return state.analysis_decision, state.analysis_reason


def step(strategy: Strategy, state: RolloutState, observed: Observations, now: float) -> RolloutDecision:
    """One reconcile: apply new commands, advance as far as the observations allow, say what to do."""
    if observed.analysis_at is not None:
        state = replace(
            state,
            analysis_looked_at=observed.analysis_at,
            analysis_decision=observed.analysis,
            analysis_reason=observed.analysis_reason,
        )
    machine = _Machine(strategy, state, observed, now)
    machine.apply_commands()
    machine.advance()
    return machine.decision()


# --- the machine ---------------------------------------------------------------------------------------


class _Machine:
    """One evaluation; holds the evolving state so each rule reads as one small method."""

    def __init__(self, strategy: Strategy, state: RolloutState, observed: Observations, now: float):
        if any(count < 0 for count in observed.ready_groups.values()):
            raise ValueError(f"ready group counts must be ≥ 0, got {dict(observed.ready_groups)}")
        self.strategy, self.state, self.observed, self.now = strategy, state, observed, now
        self.events: list[str] = []
        self.promoted: str | None = None
        self.removed: str | None = None
        self.waiting = ""  # what the rollout waits for now, if anything
        # The observed verdict was computed for the step current at the start of this call: it no longer
        # applies once a command or a transition moves to another step, and a gated step that starts in
        # this call cannot have passed yet.
        self.entry_step = (state.phase in (Phase.PROGRESSING, Phase.PAUSED), state.step_index)
        self.entry_step_started = state.step_started_at is not None

    def ready(self, revision: str | None) -> int:
        return 0 if revision is None else self.observed.ready_groups.get(revision, 0)

    # transitions

    def transition(self, reason: str, **changes) -> None:
        self.state = replace(self.state, message=reason, **changes)
        self.events.append(reason)

    def begin_rollback(self, reason: str) -> None:
        self.transition(
            reason,
            phase=Phase.ROLLING_BACK,
            canary_weight=0,
            shadow_fraction=0.0,
            pause_reason=None,
            paused_at=None,
            draining_revision=self.state.canary_revision,
            drain_started_at=self.now,
        )

    def begin_promotion(self, reason: str) -> None:
        self.transition(
            reason,
            phase=Phase.PROMOTING,
            step_index=len(self.strategy.steps),
            step_started_at=None,
            shadow_fraction=0.0,
            pause_reason=None,
            paused_at=None,
            waiting_since=self.now,
        )

    def next_step(self, reason: str) -> None:
        index = self.state.step_index + 1
        if index >= len(self.strategy.steps):
            self.begin_promotion(f"{reason}; all {len(self.strategy.steps)} steps done, promoting")
            return
        self.transition(
            f"{reason}; step {index + 1}/{len(self.strategy.steps)}",
            phase=Phase.PROGRESSING,
            step_index=index,
            step_started_at=None,
            waiting_since=self.now,
            shadow_fraction=0.0,
            pause_reason=None,
            paused_at=None,
        )

    def pause(self, why: PauseReason, reason: str) -> None:
        if self.state.phase is Phase.PAUSED and self.state.pause_reason is why:
            return
        self.transition(reason, phase=Phase.PAUSED, pause_reason=why, paused_at=self.now)

    def unpause(self, reason: str) -> None:
        started, waiting = self.state.step_started_at, self.state.waiting_since
        if self.state.pause_reason is PauseReason.USER and self.state.paused_at is not None:
            # The step clock and the progress deadline stood still while the user paused.
            paused_for = self.now - self.state.paused_at
            started = None if started is None else started + paused_for
            waiting = None if waiting is None else waiting + paused_for
        self.transition(
            reason,
            phase=Phase.PROGRESSING,
            pause_reason=None,
            paused_at=None,
            step_started_at=started,
            waiting_since=waiting,
        )

    # commands

    def apply_commands(self) -> None:
        for command in self.observed.commands:
            if command.id in self.state.handled_commands:
                continue
            self.apply(command)
            remembered = (*self.state.handled_commands, command.id)[-_REMEMBERED_COMMANDS:]
            self.state = replace(self.state, handled_commands=remembered)

    def apply(self, command: Command) -> None:
        phase, kind = self.state.phase, command.kind
        in_steps = phase in (Phase.PROGRESSING, Phase.PAUSED)
        before_switch = in_steps or (phase is Phase.PROMOTING and self.state.canary_revision is not None)
        if kind is CommandKind.ABORT and before_switch:
            self.begin_rollback(f"rollout of {self.state.canary_revision} aborted by the user")
        elif kind is CommandKind.PROMOTE_FULL and in_steps:
            self.begin_promotion("promoted by the user, remaining steps skipped")
        elif kind is CommandKind.PROMOTE and in_steps:
            self.next_step(f"step {self.state.step_index + 1} skipped by the user")
        elif kind is CommandKind.PAUSE and phase is Phase.PROGRESSING:
            self.pause(PauseReason.USER, "paused by the user")
        elif kind is CommandKind.RESUME and phase is Phase.PAUSED:
            if self.state.pause_reason is PauseReason.STEP:
                self.next_step("pause step resumed by the user")
            elif self.state.pause_reason is PauseReason.ANALYSIS_FAILED:
                self.events.append("resume ignored: the analysis failed; promote or abort the rollout")
            else:
                self.unpause("resumed by the user")
        else:
            self.events.append(f"{kind} ignored in phase {phase}")

    # advancing

    def advance(self) -> None:
        # Each pass either moves to a new step/phase or stops; the bound only guards against a bug.
        for _ in range(len(self.strategy.steps) + 8):
            before = (self.state.phase, self.state.step_index, self.state.step_started_at)
            if self.state.phase in (Phase.PROGRESSING, Phase.PAUSED):
                self.advance_steps()
            elif self.state.phase is Phase.PROMOTING:
                self.advance_promotion()
            elif self.state.phase is Phase.ROLLING_BACK:
                self.advance_rollback()
            if (self.state.phase, self.state.step_index, self.state.step_started_at) == before:
                return
        raise RuntimeError(f"rollout state machine did not settle: {self.state}")

    def verdict(self) -> AnalysisDecision | None:
        in_steps = self.state.phase in (Phase.PROGRESSING, Phase.PAUSED)
        return self.observed.analysis if (in_steps, self.state.step_index) == self.entry_step else None

    def advance_steps(self) -> None:
        verdict = self.verdict()
        detail = self.observed.analysis_reason or "no reason given"
        if verdict is AnalysisDecision.FAIL:
            if self.strategy.auto_rollback:
                self.begin_rollback(f"analysis failed: {detail}")
            else:
                self.pause(PauseReason.ANALYSIS_FAILED, f"analysis failed (automatic rollback off): {detail}")
            return
        if self.state.phase is Phase.PAUSED:
            if self.state.pause_reason is PauseReason.INCONCLUSIVE and verdict in (
                AnalysisDecision.PASS,
                AnalysisDecision.PENDING,
            ):
                self.unpause("the analysis can judge again")
            else:
                self.waiting = f"paused: {self.state.message}"
                return
        if verdict is AnalysisDecision.INCONCLUSIVE:
            self.pause(PauseReason.INCONCLUSIVE, f"analysis inconclusive: {detail}")
            return
        if self.state.step_index >= len(self.strategy.steps):
            self.begin_promotion("all steps done, promoting")
            return
        current = self.strategy.steps[self.state.step_index]
        if isinstance(current, SetWeightStep):
            self.run_set_weight(current)
        elif isinstance(current, PauseStep):
            self.run_pause(current)
        else:
            self.run_timed(current)

    def canary_groups_ready(self, needed: int) -> bool:
        ready = self.ready(self.state.canary_revision)
        if ready >= needed:
            return True
        self.waiting = f"waiting for {needed} ready canary group(s), {ready} ready"
        since = self.state.waiting_since if self.state.waiting_since is not None else self.now
        if self.state.waiting_since is None:
            self.state = replace(self.state, waiting_since=self.now)
        if self.now - since >= self.strategy.progress_deadline_s:
            self.begin_rollback(
                f"canary groups not ready after {self.strategy.progress_deadline_s:g}s "
                f"({ready} of {needed} ready): progress deadline exceeded"
            )
        return False

    def run_set_weight(self, current: SetWeightStep) -> None:
        if current.weight > 0 and not self.canary_groups_ready(
            self.strategy.canary_groups_for(current.weight)
        ):
            return
        self.state = replace(self.state, canary_weight=current.weight)
        self.next_step(f"canary weight set to {current.weight}%")

    def run_pause(self, current: PauseStep) -> None:
        if self.state.step_started_at is None:
            self.state = replace(self.state, step_started_at=self.now)
        if current.duration_s is None:
            self.pause(PauseReason.STEP, f"step {self.state.step_index + 1}: paused until promoted")
        elif self.now >= self.state.step_started_at + current.duration_s:
            self.next_step(f"pause of {current.duration_s:g}s done")
        else:
            self.waiting = f"pausing until {self.state.step_started_at + current.duration_s:.0f}"

    def run_timed(self, current: ShadowStep | AnalysisStep) -> None:
        """Shadow and analysis steps: start once the canary can take requests, end after the duration
        (ungated) or when the analysis passes (gated)."""
        if self.state.step_started_at is None:
            if not self.canary_groups_ready(1):
                return
            fraction = current.fraction if isinstance(current, ShadowStep) else self.state.shadow_fraction
            self.state = replace(self.state, step_started_at=self.now, shadow_fraction=fraction)
        gated = isinstance(current, AnalysisStep) or current.analysis
        what = "shadow" if isinstance(current, ShadowStep) else "analysis"
        over = self.now >= self.state.step_started_at + current.duration_s
        verdict = self.verdict() if self.entry_step_started else None
        if gated and verdict is AnalysisDecision.PASS:
            self.next_step(f"{what} step passed: {self.observed.analysis_reason or 'analysis passed'}")
        elif gated and over and verdict is None:
            self.pause(PauseReason.INCONCLUSIVE, f"{what} step over but no analysis verdict was observed")
        elif not gated and over:
            self.next_step(f"{what} of {current.duration_s:g}s done")
        else:
            self.waiting = f"{what} running, analysis {verdict or 'not reported'}"

    def advance_promotion(self) -> None:
        canary = self.state.canary_revision
        if canary is not None:
            # Scale the canary to full size first; shift all traffic only when every group is ready.
            if not self.canary_groups_ready(self.strategy.replicas):
                self.waiting = f"promoting: {self.waiting}"
                return
            old = self.state.stable_revision
            self.promoted = canary
            self.transition(
                f"{canary} promoted to stable; draining {old}",
                stable_revision=canary,
                canary_revision=None,
                canary_weight=0,
                draining_revision=old,
                drain_started_at=self.now,
            )
        if self.drained():
            self.removed = self.state.draining_revision
            self.transition(
                f"rollout complete; groups of {self.removed} removed",
                phase=Phase.HEALTHY,
                draining_revision=None,
                drain_started_at=None,
                step_index=0,
                step_started_at=None,
                waiting_since=None,
            )

    def advance_rollback(self) -> None:
        if self.drained():
            self.removed = self.state.draining_revision
            self.transition(
                f"{self.state.message}; rolled back, groups of {self.removed} removed after the drain",
                phase=Phase.ROLLED_BACK,
                rolled_back_revision=self.state.canary_revision,
                canary_revision=None,
                draining_revision=None,
                drain_started_at=None,
                step_started_at=None,
                waiting_since=None,
            )

    def drained(self) -> bool:
        if self.state.draining_revision is None:
            return True
        ends = self.state.drain_started_at + self.strategy.drain_timeout_s
        if self.now >= ends:
            return True
        self.waiting = f"draining {self.state.draining_revision} until {ends:.0f}"
        return False

    # output

    def decision(self) -> RolloutDecision:
        state, strategy = self.state, self.strategy
        stable, canary = state.stable_revision, state.canary_revision
        actions: list[Action] = []
        if self.promoted is not None:
            actions.append(PromoteRevision(self.promoted))

        stable_ready = self.ready(stable) > 0
        canary_ready = self.ready(canary)
        if canary is None:
            weights = {stable: 100 if stable_ready else 0}
            if state.draining_revision is not None:
                weights[state.draining_revision] = 0
            groups = {stable: strategy.replicas}
        else:
            canary_weight = state.canary_weight if canary_ready > 0 else 0
            weights = {
                stable: (100 - state.canary_weight) if stable_ready else 0,
                canary: canary_weight,
            }
            if state.phase is Phase.PROMOTING:
                canary_groups = strategy.replicas
            elif state.phase is Phase.ROLLING_BACK:
                canary_groups = canary_ready  # keep the groups that serve the draining streams
            else:
                canary_groups = strategy.canary_groups_for(self.target_weight())
            groups = {stable: strategy.replicas, canary: canary_groups}
        if state.draining_revision is not None and state.draining_revision not in groups:
            groups[state.draining_revision] = strategy.replicas  # the old stable keeps serving its streams
        actions.append(SetWeights(weights))
        shadow_on = canary_ready > 0 and state.shadow_fraction > 0
        actions.append(SetShadow(canary if shadow_on else None, state.shadow_fraction if shadow_on else 0.0))
        actions.extend(ScaleGroups(revision, count) for revision, count in groups.items())
        if self.removed is not None:
            actions.append(RemoveGroups(self.removed))
        reason = self.waiting or state.message or f"{state.phase}"
        return RolloutDecision(state, tuple(actions), reason, tuple(self.events))

    def target_weight(self) -> int:
        """The canary weight the current step aims at: groups are scaled ahead of the weight."""
        steps = self.strategy.steps
        if self.state.step_index < len(steps) and isinstance(steps[self.state.step_index], SetWeightStep):
            return max(self.state.canary_weight, steps[self.state.step_index].weight)
        return self.state.canary_weight
