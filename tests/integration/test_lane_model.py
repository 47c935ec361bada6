"""A stateful model test of lanes (issue: Lanes, DESIGN.md §1 layer 2, §3
items 1, 2, 7).

A hypothesis state machine drives one or two lanes of a real PostgreSQL with
random submits (enqueue, reject, steer; reused request_ids), request cancels,
promotions to steer, a stand-in worker's outcomes (claim, complete, fail,
retry until dead, steered, interrupt with or without expiry), resumes, run
cancels, continues, recovery passes and crashes that skip the relay. After
every step it compares what the system stores (snapshots, get_request
positions, rows) with ``Model``: a plain Python reading of the issue's
rules, written without the rules in ``runlane.lanes`` (no ``decide_intake``
or ``continue_refusal`` here). Every
refusal code must be the one the model predicts.

Where the real system departs from the letter of the issue, the model
follows the real system only for the departures named in ``ACCEPTED``, each
marked ``DISCREPANCY`` where the model branches on it. Remove a name from
``ACCEPTED`` and the model expects the issue's letter instead: the test then
shows the difference. Where the issue is silent or two rules meet, the model
reads it as follows (and says so where it does):

- idempotency compares the *original* policy too (rule 5's "the original
  submission"): another policy is a ``request_id_conflict``;
- a cancel request wins over a steer (DESIGN.md §3.10): the run ends
  ``cancelled`` and the lane pauses, the steer first in its queue;
- cancelling the last queued request of a paused lane lifts the pause;
- an interrupted run that was resumed is over (it keeps the status
  ``interrupted``): cancelling it is ``run_finished``, and it never expires.

Fixed paths that random search reaches only now and then run through the
same machine at the end of this file.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar
from uuid import UUID

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, currently_in_test_context, event
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg.rows import dict_row

from runlane.database import create_pool
from runlane.errors import LaneRefused, NotFound, RunFinished
from runlane.lane_service import LaneService
from runlane.lane_store import LaneStore
from runlane.lanes import LaneSnapshot
from runlane.models import Outcome
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore

T = TypeVar("T")

TENANT, USER = "acme", "ann"
# (agent, thread_id) of each lane. Distinct agents let the stand-in worker
# claim exactly the lane it means (claim_batch takes the best pending run of
# any lane otherwise).
LANES = (("bot-a", "t1"), ("bot-b", "t2"))
POLICIES = ("enqueue", "reject", "steer")
ACTIVE = frozenset({"pending", "running", "cancel_requested"})
UNFINISHED = ACTIVE | {"interrupted"}
TERMINAL = frozenset({"completed", "failed", "dead", "cancelled", "interrupted"})

# Departures of the real system from the letter that the model
# accepts (see the DISCREPANCY comments below and the module docstring).
ACCEPTED: frozenset[str] = frozenset(
    {
        "steer_waits_for_resume",
    }
)


# -- the model ------------------------------------------------------------------


@dataclass(eq=False)
class MRun:
    n: int
    lane: int
    kind: str  # "request" or "resume"
    max_attempts: int
    request: MRequest
    status: str = "pending"
    attempts: int = 0
    # Asked to yield to a queued steer (runs.steer_requested_at is set).
    asked: bool = False
    outcome: str | None = None
    resumed_from: MRun | None = None
    resume_value: str | None = None
    resume: MRun | None = None  # the resume created for this run
    expires: bool = False  # interrupted with an expiry
    real_id: UUID | None = None
    token: UUID | None = None  # the lease the stand-in worker holds


@dataclass(eq=False)
class MRequest:
    request_id: str
    lane: int
    text: str
    policy: str  # of the original submission
    order: int
    max_attempts: int
    steer: bool = False
    status: str = "queued"
    reason: str | None = None
    run: MRun | None = None


@dataclass
class MLane:
    orders: int = 0
    paused_run: MRun | None = None
    paused_reason: str | None = None
    interrupted_run: MRun | None = None


@dataclass
class Expect:
    """What an operation should do: refused with ``code``, or succeed."""

    code: str | None = None
    request: MRequest | None = None
    run: MRun | None = None
    created: bool = False


class Model:
    """The issue's rules over plain Python objects."""

    def __init__(self) -> None:
        self.lanes = [MLane(), MLane()]
        self.requests: dict[str, MRequest] = {}
        self.runs: list[MRun] = []

    # -- derived facts --------------------------------------------------------

    def active(self, lane: int) -> MRun | None:
        found = [r for r in self.runs if r.lane == lane and r.status in ACTIVE]
        assert len(found) <= 1, "model bug: two active runs"
        return found[0] if found else None

    def queue(self, lane: int) -> list[MRequest]:
        """Queued requests in dispatch order: a steer first, then server order."""
        waiting = [r for r in self.requests.values() if r.lane == lane and r.status == "queued"]
        return sorted(waiting, key=lambda r: (not r.steer, r.order))

    def position(self, request: MRequest) -> int | None:
        if request.status != "queued":
            return None
        return self.queue(request.lane).index(request) + 1

    def state(self, lane: int) -> str:
        if self.active(lane) is not None:
            return "running"
        if self.lanes[lane].interrupted_run is not None:
            return "interrupted"
        if self.lanes[lane].paused_run is not None:
            return "paused"
        return "idle"

    def snapshot_run(self, lane: int) -> MRun | None:
        """The run a snapshot names: active, else interrupted, else blocking."""
        state = self.state(lane)
        if state == "running":
            return self.active(lane)
        if state == "interrupted":
            return self.lanes[lane].interrupted_run
        if state == "paused":
            return self.lanes[lane].paused_run
        return None

    # -- transitions ------------------------------------------------------------

    def _store(
        self, lane: int, request_id: str, text: str, policy: str, max_attempts: int
    ) -> MRequest:
        self.lanes[lane].orders += 1
        request = MRequest(request_id, lane, text, policy, self.lanes[lane].orders, max_attempts)
        self.requests[request_id] = request
        return request

    def _dispatch_head(self, lane: int) -> MRun | None:
        queue = self.queue(lane)
        if not queue:
            return None
        head = queue[0]
        run = MRun(len(self.runs), lane, "request", head.max_attempts, head)
        self.runs.append(run)
        head.status, head.run = "dispatched", run
        return run

    def _ask_to_yield(self, run: MRun) -> None:
        """A steer now waits in the lane of ``run``, its active run."""
        if run.kind == "resume" and "steer_waits_for_resume" in ACCEPTED:
            # DISCREPANCY steer_waits_for_resume: the issue says the active
            # run learns of a queued steer at its next safe point and yields.
            # The real system never asks a resume run to yield (nor
            # supersedes a pending one): "a resume carries a human's answer"
            # (lane_store._ask_to_yield). The steer waits, queued, until the
            # resume run ends.
            return
        if run.status == "pending" and "steer_supersedes_pending_run" in ACCEPTED:
            # DISCREPANCY steer_supersedes_pending_run: the issue says a busy
            # lane queues the steer and the active run learns of it at its
            # next safe point. The real system ends an active run that is
            # still `pending` (never claimed, or waiting for a retry) at once
            # as completed/steered, and the relay dispatches the steer in the
            # same transaction: the steer is `dispatched`, not `queued`.
            run.asked = True
            run.status, run.outcome = "completed", "steered"
            self._relay(run)
        else:
            run.asked = True

    def _relay(self, run: MRun) -> None:
        """In the transaction of the terminal write of a lane's run."""
        lane = self.lanes[run.lane]
        if run.status == "interrupted":
            lane.interrupted_run = run
            return
        if lane.interrupted_run is run:
            lane.interrupted_run = None
        if run.status == "completed":
            self._dispatch_head(run.lane)
        elif self.queue(run.lane):
            lane.paused_run, lane.paused_reason = run, f"run_{run.status}"

    def submit(
        self, lane: int, request_id: str, text: str, policy: str, max_attempts: int
    ) -> Expect:
        existing = self.requests.get(request_id)
        if existing is not None:
            # Rule 6: same lane and input returns the existing request. The
            # original policy is part of "the original submission" (rule 5:
            # idempotency compares the original submission, not the promoted
            # policy): another policy is a conflict.
            if (existing.lane, existing.text, existing.policy) != (lane, text, policy):
                return Expect("request_id_conflict")
            return Expect(request=existing, created=False)
        state = self.state(lane)
        if state == "interrupted":
            # Rule 9: enqueue and steer store nothing; reject is stored.
            if policy != "reject":
                return Expect("run_interrupted")
            request = self._store(lane, request_id, text, policy, max_attempts)
            request.status, request.reason = "rejected", "run_interrupted"
            return Expect(request=request, created=True)
        if policy == "reject":
            # Rule 4: dispatched only if it becomes the running head at once.
            reason = {"running": "lane_busy", "paused": "lane_paused"}.get(state)
            if reason is None and self.queue(lane):
                reason = "queue_not_empty"
            request = self._store(lane, request_id, text, policy, max_attempts)
            if reason is None:
                self._dispatch_head(lane)
            else:
                request.status, request.reason = "rejected", reason
            return Expect(request=request, created=True)
        if policy == "steer" and any(r.steer for r in self.queue(lane)):
            return Expect("steer_already_pending")
        request = self._store(lane, request_id, text, policy, max_attempts)
        request.steer = policy == "steer"
        active = self.active(lane)
        if state == "idle":
            self._dispatch_head(lane)
        elif request.steer and active is not None:
            self._ask_to_yield(active)
        return Expect(request=request, created=True)

    def cancel_request(self, request_id: str) -> Expect:
        request = self.requests.get(request_id)
        if request is None:
            return Expect("not_found")
        if request.status == "cancelled":
            return Expect(request=request)
        if request.status == "dispatched":
            return Expect("request_already_dispatched", request=request)
        if request.status != "queued":
            return Expect("request_not_queued")
        active = self.active(request.lane)
        # Rule 5: a steer the active run was already asked to yield to.
        if request.steer and active is not None and active.asked:
            return Expect("steer_in_progress")
        request.status = "cancelled"
        lane = self.lanes[request.lane]
        if lane.paused_run is not None and not self.queue(request.lane):
            # Nothing waits any more: a lane is paused only while requests
            # wait (DESIGN.md §2), so it is idle again.
            lane.paused_run = lane.paused_reason = None
        return Expect(request=request)

    def promote(self, request_id: str) -> Expect:
        request = self.requests.get(request_id)
        if request is None:
            return Expect("not_found")
        if request.status == "dispatched":
            return Expect("request_already_dispatched", request=request)
        if request.status != "queued":
            return Expect("request_not_queued")
        if request.steer:
            return Expect(request=request)
        if self.state(request.lane) == "interrupted":
            return Expect("run_interrupted")
        if any(r.steer for r in self.queue(request.lane)):
            return Expect("steer_already_pending")
        request.steer = True
        active = self.active(request.lane)
        if active is not None:
            self._ask_to_yield(active)
        elif self.state(request.lane) == "idle":
            self._dispatch_head(request.lane)
        return Expect(request=request)

    def continue_lane(self, lane: int) -> Expect:
        state = self.state(lane)
        if state == "interrupted":
            return Expect("run_interrupted")
        if state == "running":
            return Expect("run_active")
        if self.lanes[lane].paused_run is None:
            return Expect("queue_not_paused")
        if not self.queue(lane):
            return Expect("queue_empty")
        self.lanes[lane].paused_run = self.lanes[lane].paused_reason = None
        run = self._dispatch_head(lane)
        assert run is not None
        return Expect(request=run.request, run=run)

    def recover(self, clock_jumped: bool) -> tuple[int, int]:
        """The maintenance pass (rule 10): dispatches the head of every idle
        lane with queued requests, then ends unanswered interrupts past
        their expiry, cancelled. Returns (dispatched, expired)."""
        dispatched = expired = 0
        for lane in range(len(self.lanes)):
            if self.state(lane) == "idle" and self.queue(lane):
                self._dispatch_head(lane)
                dispatched += 1
        if clock_jumped:
            for run in self.runs:
                if run.status == "interrupted" and run.expires:
                    run.status = "cancelled"
                    self._relay(run)
                    expired += 1
        return dispatched, expired

    def crash_before_relay(self, run: MRun) -> None:
        """The run ended completed but its lane never moved on (a crash
        between two statements, or an operator's edit)."""
        run.status, run.token = "completed", None

    def claim(self, run: MRun) -> None:
        assert run.status == "pending"
        run.status = "running"
        run.attempts += 1

    def finish(self, run: MRun, outcome: str) -> None:
        """The worker's fenced terminal write for the attempt it holds."""
        assert run.status in ("running", "cancel_requested")
        run.token = None
        cancel_asked = run.status == "cancel_requested"
        if outcome in ("retry", "steered", "interrupted") and cancel_asked:
            # A cancel is never lost: it wins over anything but a completion
            # (or a failure) that commits first.
            run.status = "cancelled"
        elif outcome == "steered":
            run.status, run.outcome = "completed", "steered"
        elif outcome == "retry":
            run.status = "dead" if run.attempts >= run.max_attempts else "pending"
        else:
            run.status = outcome
        if run.status in TERMINAL:
            self._relay(run)

    def cancel_run(self, run: MRun) -> Expect:
        if run.status in ("completed", "failed", "dead"):
            return Expect("run_finished")
        if run.status == "interrupted" and run.resume is not None:
            # Answered: the interrupt is over (its status stays
            # `interrupted`); cancel its resume instead.
            return Expect("run_finished")
        if run.status == "running":
            run.status = "cancel_requested"
        elif run.status in ("pending", "interrupted"):
            run.status = "cancelled"
            self._relay(run)
        return Expect(run=run)

    def resume(self, run: MRun, value: str) -> Expect:
        if run.resume is not None:
            if run.resume.resume_value == value:
                return Expect(run=run.resume, created=False)
            return Expect("resume_superseded")
        if run.status != "interrupted":
            return Expect("not_interrupted")
        lane = self.lanes[run.lane]
        if lane.interrupted_run is not run:
            return Expect("resume_superseded")
        resumed = MRun(len(self.runs), run.lane, "resume", run.max_attempts, run.request)
        resumed.resumed_from, resumed.resume_value = run, value
        if "steer_waits_for_resume" not in ACCEPTED:
            # Rule 5: a queued steer waits in the lane, so the (new) active
            # run learns of it like any other.
            resumed.asked = any(r.steer for r in self.queue(run.lane))
        self.runs.append(resumed)
        run.resume = resumed
        run.expires = False  # an answered interrupt never expires
        lane.interrupted_run = None
        return Expect(run=resumed, created=True)


# -- the real system ----------------------------------------------------------


class Env:
    """The services under test, driven from synchronous code through a
    dedicated event loop."""

    def __init__(self, db_url: str, service_settings: Settings) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool = create_pool(db_url, min_size=1, max_size=4)
        self.run(self.pool.open(wait=True))
        self.store = RunStore(self.pool)
        self.runs = RunService(self.store, service_settings)
        self.lanes = LaneService(LaneStore(self.pool), self.runs)
        self.sql = psycopg.connect(db_url, autocommit=True, row_factory=dict_row)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def reset(self) -> None:
        """Empties the lanes and runs for the next example. DELETE of a few
        rows is far quicker than TRUNCATE (or a new database); attempts and
        listing rows (runs_delete_dependents, migrations 0027-0031), events
        and effects (ON DELETE CASCADE) go with their runs."""
        self.sql.execute(
            "DELETE FROM runlane.runs; DELETE FROM runlane.requests; DELETE FROM runlane.lanes"
        )

    def close(self) -> None:
        try:
            self.sql.close()
            self.run(self.pool.close())
            self.run(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()


class LaneArgs(TypedDict):
    tenant: str
    user_id: str
    agent: str
    thread_id: str


def lane_args(lane: int) -> LaneArgs:
    agent, thread = LANES[lane]
    return {"tenant": TENANT, "user_id": USER, "agent": agent, "thread_id": thread}


picks = st.integers(min_value=0, max_value=1 << 16)


@dataclass(frozen=True)
class Submission:
    lane: int  # taken modulo the number of lanes
    policy: str
    # None: a new request_id; else one used before (stored or refused),
    # picked modulo their number.
    reuse: int | None
    same_input: bool  # when reused
    same_policy: bool  # when reused: the original submission's policy
    max_attempts: int
    # The stand-in worker claims the lane's pending run first (so that
    # steers meet running runs too).
    worker_first: bool


submissions = st.builds(
    Submission,
    lane=picks,
    policy=st.sampled_from(POLICIES),
    reuse=st.one_of(st.none(), st.none(), picks),
    same_input=st.sampled_from([True, True, True, False]),
    same_policy=st.sampled_from([True, True, False]),
    max_attempts=st.integers(min_value=1, max_value=2),
    worker_first=st.booleans(),
)


class LaneMachine(RuleBasedStateMachine):
    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        env.reset()
        self.model = Model()
        self.n_lanes = 1
        self.ids = itertools.count()
        # Every request_id used so far, stored or refused (a refused one was
        # never stored, so it is new when it comes again).
        self.known_ids: list[str] = []
        # Requests this step acted on: read back through get_request after
        # it (besides every queued request, for its live position).
        self.touched: set[str] = set()
        self.last = ""  # how the latest operation ended

    # -- helpers ------------------------------------------------------------

    def note(self, what: str) -> None:
        """Labels what a step did (a hypothesis event) when hypothesis runs
        the machine."""
        if currently_in_test_context():
            event(what)

    def outcome(self, operation: str, outcome: str) -> None:
        """Records how an operation ended: a refusal code, or what it did."""
        self.last = outcome
        self.note(f"{operation}: {outcome}")

    def call(self, coro: Coroutine[Any, Any, T]) -> tuple[T | None, str | None, Exception | None]:
        """Runs an operation; returns (result, refusal code, error)."""
        try:
            return self.env.run(coro), None, None
        except (LaneRefused, NotFound, RunFinished) as exc:
            return None, exc.code, exc

    def lane(self, pick: int) -> int:
        return pick % self.n_lanes

    def real_lane_id(self, lane: int) -> int:
        agent, thread = LANES[lane]
        row = self.env.sql.execute(
            "SELECT id FROM runlane.lanes WHERE tenant = %s AND user_id = %s"
            " AND agent = %s AND thread_id = %s",
            (TENANT, USER, agent, thread),
        ).fetchone()
        assert row is not None
        return int(row["id"])

    def queued_ids(self) -> list[str]:
        return [r.request_id for r in self.model.requests.values() if r.status == "queued"]

    def runs_in(self, statuses: Collection[str]) -> list[MRun]:
        return [r for r in self.model.runs if r.status in statuses]

    def pick_run(self, pick: int, statuses: Collection[str]) -> MRun:
        runs = self.runs_in(statuses)
        return runs[pick % len(runs)]

    def real(self, run: MRun) -> UUID:
        assert run.real_id is not None, f"run {run.n} was never seen in the database"
        return run.real_id

    def claim(self, run: MRun) -> None:
        """The stand-in worker claims the lane's pending run."""
        agent = LANES[run.lane][0]
        claimed = self.env.run(
            self.env.store.claim_batch(worker_id="model", limit=1, lease_seconds=30, agents=[agent])
        )
        assert [c.id for c in claimed] == [self.real(run)], "claimed another run"
        self.model.claim(run)
        run.token = claimed[0].lease_token
        assert claimed[0].attempts == run.attempts

    def finish(self, run: MRun, outcome: Outcome, **kwargs: Any) -> None:
        if run.status == "pending":
            self.claim(run)
        assert run.token is not None
        token = run.token
        before = run.status
        self.model.finish(run, str(outcome))
        self.outcome(f"finish {before} {outcome}", run.status)
        ended = self.env.run(
            self.env.store.finish_attempt(
                self.real(run), token, outcome, lane_id=self.real_lane_id(run.lane), **kwargs
            )
        )
        assert ended is not None, "lease lost"
        assert str(ended.status) == run.status

    # -- rules ----------------------------------------------------------------

    @initialize(two=st.booleans())
    def choose_lanes(self, two: bool) -> None:
        self.n_lanes = 2 if two else 1

    # One argument, and first by name: hypothesis tries the rule with the
    # fewest arguments (then by name) as the simplest step, and submissions
    # are what builds interesting lanes.
    @rule(sub=submissions)
    def add_request(self, sub: Submission) -> None:
        self.submit(sub)

    @rule(subs=st.lists(submissions, min_size=2, max_size=4))
    def add_requests(self, subs: list[Submission]) -> None:
        """A burst of submissions (builds queues)."""
        for sub in subs:
            self.submit(sub)

    def submit(self, sub: Submission) -> None:
        lane = self.lane(sub.lane)
        policy = sub.policy
        active = self.model.active(lane)
        if sub.worker_first and active is not None and active.status == "pending":
            self.claim(active)
        if sub.reuse is None or not self.known_ids:
            request_id = f"r{next(self.ids)}"
            self.known_ids.append(request_id)
            text = request_id
        else:
            request_id = self.known_ids[sub.reuse % len(self.known_ids)]
            original = self.model.requests.get(request_id)
            text = request_id if sub.same_input else f"{request_id}-other"
            if original is not None and sub.same_policy:
                policy = original.policy
        max_attempts = sub.max_attempts
        replay = " again" if request_id in self.model.requests else ""
        worker = " running" if active is not None and active.status != "pending" else ""
        expect = self.model.submit(lane, request_id, text, policy, max_attempts)
        result, code, _ = self.call(
            self.env.lanes.submit(
                **lane_args(lane),
                input={"text": text},
                policy=policy,
                request_id=request_id,
                max_attempts=max_attempts,
            )
        )
        assert code == expect.code, (policy, request_id)
        stored = expect.request
        self.outcome(
            f"submit {policy}{replay}{worker}",
            code or (stored and " ".join(filter(None, (stored.status, stored.reason)))) or "",
        )
        if result is not None:
            request, created = result
            assert expect.request is not None
            assert created == expect.created
            assert request.request_id == request_id
            assert (str(request.status), request.reason) == (
                expect.request.status,
                expect.request.reason,
            )
            assert request.position == self.model.position(expect.request)
            if not created:
                # Rule 6: the existing request, with its run (if any).
                run = expect.request.run
                assert request.run_id == (run.real_id if run is not None else None)
        self.touched.add(request_id)
        self.bind_runs()

    def cancel_request(self, request_id: str) -> None:
        expect = self.model.cancel_request(request_id)
        result, code, error = self.call(
            self.env.lanes.cancel_request(tenant=TENANT, request_id=request_id)
        )
        assert code == expect.code, request_id
        self.outcome("cancel request", code or "cancelled")
        if code == "request_already_dispatched":
            # Rule 7: the refusal names the run to cancel instead.
            assert expect.request is not None and expect.request.run is not None
            assert isinstance(error, LaneRefused)
            assert error.run_id == self.real(expect.request.run)
        if result is not None:
            assert str(result.status) == "cancelled" and result.position is None
        self.touched.add(request_id)

    @precondition(lambda self: self.queued_ids())
    @rule(pick=picks)
    def cancel_queued_request(self, pick: int) -> None:
        queued = self.queued_ids()
        self.cancel_request(queued[pick % len(queued)])

    @precondition(lambda self: self.known_ids)
    @rule(pick=picks)
    def cancel_any_request(self, pick: int) -> None:
        self.cancel_request(self.known_ids[pick % len(self.known_ids)])

    def promote(self, request_id: str) -> None:
        expect = self.model.promote(request_id)
        result, code, _ = self.call(
            self.env.lanes.promote_to_steer(tenant=TENANT, request_id=request_id)
        )
        assert code == expect.code, request_id
        self.outcome("promote", code or (expect.request and expect.request.status) or "")
        if result is not None:
            assert expect.request is not None
            assert result.steer and str(result.status) == expect.request.status
            assert result.position == self.model.position(expect.request)
        self.touched.add(request_id)

    @precondition(lambda self: self.queued_ids())
    @rule(pick=picks)
    def promote_queued_request(self, pick: int) -> None:
        queued = self.queued_ids()
        self.promote(queued[pick % len(queued)])

    @precondition(lambda self: self.known_ids)
    @rule(pick=picks)
    def promote_any_request(self, pick: int) -> None:
        self.promote(self.known_ids[pick % len(self.known_ids)])

    @precondition(lambda self: self.runs_in(("pending",)))
    @rule(pick=picks)
    def claim_pending_run(self, pick: int) -> None:
        pending = self.runs_in(("pending",))
        self.claim(pending[pick % len(pending)])

    # The worker's outcomes for a lane's active run (claimed first if it is
    # still pending).

    @precondition(lambda self: self.runs_in(ACTIVE))
    @rule(pick=picks, outcome=st.sampled_from(["completed", "completed", "failed", "retry"]))
    def finish_active_run(self, pick: int, outcome: str) -> None:
        run = self.pick_run(pick, ACTIVE)
        if outcome == "completed":
            self.finish(run, Outcome.COMPLETED, output={"done": run.n})
        elif outcome == "failed":
            self.finish(run, Outcome.FAILED, error={"code": "boom", "message": "model failure"})
        else:
            # A retryable failure: pending again at once, or dead when the
            # attempts are used up.
            self.finish(run, Outcome.RETRY, retry_delay_seconds=0)

    @precondition(lambda self: any(r.asked for r in self.runs_in(ACTIVE)))
    @rule(pick=picks)
    def yield_to_steer(self, pick: int) -> None:
        """The active run sees the steer at a safe point and ends steered."""
        asked = [r for r in self.runs_in(ACTIVE) if r.asked]
        run = asked[pick % len(asked)]
        if run.status == "pending":
            self.claim(run)
        # The heartbeat's reply tells the worker that a steer waits.
        assert run.token is not None
        held = self.env.run(
            self.env.store.renew_leases([(self.real(run), run.token)], lease_seconds=30)
        )
        assert held[self.real(run)].steer_requested
        self.finish(run, Outcome.STEERED, output={"steered": run.n})

    @precondition(lambda self: self.runs_in(ACTIVE))
    @rule(pick=picks, expires=st.booleans())
    def interrupt_active_run(self, pick: int, expires: bool = False) -> None:
        run = self.pick_run(pick, ACTIVE)
        self.finish(
            run,
            Outcome.INTERRUPTED,
            interrupt={"ask": f"approve {run.n}?"},
            interrupt_expires_in=3600 if expires else None,
        )
        run.expires = expires and run.status == "interrupted"

    # Resume, cancel run, continue.

    def resume(self, run: MRun, value: str) -> None:
        before = f"{run.status}{' (resumed)' if run.resume else ''}"
        expect = self.model.resume(run, value)
        result, code, _ = self.call(self.env.lanes.resume(self.real(run), value, tenant=TENANT))
        assert code == expect.code, run.n
        self.outcome(f"resume {before}", code or ("created" if expect.created else "existing"))
        if result is not None:
            resumed, created = result
            assert expect.run is not None and created == expect.created
            if created:
                expect.run.real_id = resumed.id
            assert resumed.id == self.real(expect.run)
            assert (resumed.kind, resumed.resumed_from) == ("resume", self.real(run))

    @precondition(lambda self: self.runs_in(("interrupted",)))
    @rule(pick=picks, value=st.sampled_from(["yes", "no"]))
    def resume_interrupted_run(self, pick: int, value: str) -> None:
        self.resume(self.pick_run(pick, ("interrupted",)), value)

    @precondition(lambda self: self.model.runs)
    @rule(pick=picks, value=st.sampled_from(["yes", "no"]))
    def resume_any_run(self, pick: int, value: str) -> None:
        self.resume(self.model.runs[pick % len(self.model.runs)], value)

    def cancel_run(self, run: MRun) -> None:
        before = f"{run.status}{' (resumed)' if run.resume else ''}"
        expect = self.model.cancel_run(run)
        result, code, _ = self.call(self.env.lanes.cancel_run(self.real(run), tenant=TENANT))
        assert code == expect.code, run.n
        self.outcome(f"cancel run {before}", code or run.status)
        if result is not None:
            assert str(result.status) == run.status

    @precondition(lambda self: self.runs_in(UNFINISHED))
    @rule(pick=picks)
    def cancel_unfinished_run(self, pick: int) -> None:
        self.cancel_run(self.pick_run(pick, UNFINISHED))

    @precondition(lambda self: self.model.runs)
    @rule(pick=picks)
    def cancel_any_run(self, pick: int) -> None:
        self.cancel_run(self.model.runs[pick % len(self.model.runs)])

    @precondition(lambda self: self.model.runs)
    @rule(lane=picks)
    def continue_lane(self, lane: int) -> None:
        lane = self.lane(lane)
        expect = self.model.continue_lane(lane)
        result, code, _ = self.call(self.env.lanes.continue_lane(**lane_args(lane)))
        assert code == expect.code, lane
        self.outcome("continue", code or "dispatched")
        if result is not None:
            assert expect.request is not None
            assert result.request_id == expect.request.request_id
            assert str(result.status) == "dispatched"

    def recovery_has_work(self) -> bool:
        model = self.model
        idle_with_queue = any(
            model.state(lane) == "idle" and model.queue(lane) for lane in range(self.n_lanes)
        )
        return idle_with_queue or any(r.expires for r in self.runs_in(("interrupted",)))

    @precondition(recovery_has_work)
    @rule(clock_jumps=st.booleans())
    def recover(self, clock_jumps: bool) -> None:
        """The maintenance pass; with ``clock_jumps``, every interrupt
        expiry set so far has passed."""
        if clock_jumps:
            self.env.sql.execute(
                "UPDATE runlane.runs SET interrupt_expires_at = now() - interval '1 second'"
                " WHERE interrupt_expires_at IS NOT NULL"
            )
        expected = self.model.recover(clock_jumps)
        result = self.env.run(self.env.lanes.lanes.recover())
        assert result is not None, "the recovery lock is free"
        assert (result.dispatched, result.interrupts_expired) == expected
        self.outcome("recover", f"{expected[0]} dispatched, {expected[1]} expired")

    @precondition(
        lambda self: any(self.model.queue(r.lane) for r in self.runs_in(("pending", "running")))
    )
    @rule(pick=picks)
    def crash_before_relay(self, pick: int) -> None:
        """Leaves a lane idle with requests queued, as only a crash between
        two statements or an operator's edit can: its active run ends
        completed with the relay trigger bypassed."""
        runs = [r for r in self.runs_in(("pending", "running")) if self.model.queue(r.lane)]
        run = runs[pick % len(runs)]
        self.model.crash_before_relay(run)
        with self.env.sql.transaction():
            self.env.sql.execute("SET LOCAL session_replication_role = replica")
            self.env.sql.execute(
                "UPDATE runlane.runs SET status = 'completed', finished_at = now(),"
                " lease_token = NULL, lease_expires_at = NULL, worker_id = NULL"
                " WHERE id = %s",
                (self.real(run),),
            )

    # -- checks after every step ----------------------------------------------

    def bind_runs(self) -> None:
        """Learns the ids of runs the system created for dispatched requests."""
        for request in self.model.requests.values():
            run = request.run
            if run is not None and run.real_id is None:
                row = self.env.sql.execute(
                    "SELECT run_id FROM runlane.requests WHERE tenant = %s AND request_id = %s",
                    (TENANT, request.request_id),
                ).fetchone()
                assert row is not None and row["run_id"] is not None, request.request_id
                run.real_id = row["run_id"]

    @invariant()
    def system_matches_model(self) -> None:
        self.bind_runs()
        self.check_requests()
        self.check_runs()
        self.check_stored_invariants(self.check_lanes())
        self.touched.clear()

    def check_requests(self) -> None:
        model = self.model
        rows = self.env.sql.execute(
            "SELECT q.*, l.agent, l.thread_id FROM runlane.requests AS q"
            " JOIN runlane.lanes AS l ON l.id = q.lane_id"
        ).fetchall()
        # Nothing stored that the model did not store (refusals store
        # nothing), nothing lost.
        assert sorted(row["request_id"] for row in rows) == sorted(model.requests)
        for row in rows:
            request = model.requests[row["request_id"]]
            assert (row["agent"], row["thread_id"]) == LANES[request.lane]
            assert row["input"] == {"text": request.text}
            assert (row["policy"], row["steer"]) == (request.policy, request.steer), row
            assert (row["status"], row["reason"]) == (request.status, request.reason), row
            expected_run = request.run.real_id if request.run is not None else None
            assert row["run_id"] == expected_run, row["request_id"]
        queued = {r.request_id for r in model.requests.values() if r.status == "queued"}
        for request_id in sorted((self.touched & set(model.requests)) | queued):
            request = model.requests[request_id]
            real = self.env.run(self.env.lanes.get_request(tenant=TENANT, request_id=request_id))
            assert str(real.status) == request.status
            assert real.position == model.position(request), request_id

    def check_runs(self) -> None:
        model = self.model
        rows = {
            row["id"]: row
            for row in self.env.sql.execute(
                "SELECT r.*, q.request_id AS client_request_id FROM runlane.runs AS r"
                " LEFT JOIN runlane.requests AS q ON q.id = r.request_id"
            ).fetchall()
        }
        assert sorted(map(str, rows)) == sorted(str(self.real(run)) for run in model.runs)
        for run in model.runs:
            row = rows[self.real(run)]
            where = f"run {run.n}"
            assert (row["status"], row["attempts"]) == (run.status, run.attempts), where
            assert (row["kind"], row["outcome"]) == (run.kind, run.outcome), where
            assert row["agent"] == LANES[run.lane][0], where
            assert row["client_request_id"] == run.request.request_id, where
            assert row["input"] == {"text": run.request.text}, where
            assert (row["steer_requested_at"] is not None) == run.asked, where
            resumed_from = run.resumed_from.real_id if run.resumed_from else None
            assert row["resumed_from"] == resumed_from, where
            assert row["resume_value"] == run.resume_value, where
            assert row["max_attempts"] == run.max_attempts, where

    def check_lanes(self) -> list[LaneSnapshot]:
        model = self.model
        snapshots = []
        for lane in range(self.n_lanes):
            snap = self.env.run(self.env.lanes.snapshot(**lane_args(lane)))
            snapshots.append(snap)
            state = model.state(lane)
            self.note(f"lane {state}, {min(len(model.queue(lane)), 3)} queued")
            assert str(snap.state) == state, lane
            reason = model.lanes[lane].paused_reason if state == "paused" else None
            assert snap.paused_reason == reason, lane
            named = model.snapshot_run(lane)
            assert snap.run_id == (named.real_id if named is not None else None), lane
            queue = model.queue(lane)
            assert [(r.request_id, r.position) for r in snap.queued] == [
                (r.request_id, i) for i, r in enumerate(queue, start=1)
            ], lane
        return snapshots

    def check_stored_invariants(self, snapshots: list[LaneSnapshot]) -> None:
        """The issue's invariants, on what is stored (no model involved), in
        one round trip."""
        row = self.env.sql.execute(STORED_INVARIANTS).fetchone()
        assert row is not None
        broken = [name for name, value in row.items() if name != "queued" and value]
        assert not broken, broken
        # 7, continued: every queued request is in its lane's snapshot, with
        # a position (1 = next, no gaps).
        assert sum(len(s.queued) for s in snapshots) == row["queued"]
        for snap in snapshots:
            assert [r.position for r in snap.queued] == list(range(1, len(snap.queued) + 1))


ACTIVE_SQL = "('pending', 'running', 'cancel_requested')"
STORED_INVARIANTS = f"""
SELECT
    -- 1. At most one active run per lane.
    EXISTS (SELECT 1 FROM runlane.runs WHERE lane_id IS NOT NULL AND status IN {ACTIVE_SQL}
            GROUP BY lane_id HAVING count(*) > 1) AS two_active_runs,
    -- 2. At most one queued steer per lane.
    EXISTS (SELECT 1 FROM runlane.requests WHERE status = 'queued' AND steer
            GROUP BY lane_id HAVING count(*) > 1) AS two_queued_steers,
    -- 7. No request lost: dispatched (with its run), cancelled, rejected
    -- (with a reason), or queued (with a position: see the snapshots).
    EXISTS (SELECT 1 FROM runlane.requests
            WHERE status NOT IN ('queued', 'dispatched', 'cancelled', 'rejected')
               OR (run_id IS NOT NULL) <> (status = 'dispatched')
               OR (reason IS NOT NULL) <> (status = 'rejected')) AS request_astray,
    -- A pause holds only while requests wait and no run is active.
    EXISTS (SELECT 1 FROM runlane.lanes AS l
            WHERE l.paused_run_id IS NOT NULL
              AND (EXISTS (SELECT 1 FROM runlane.runs AS r
                           WHERE r.lane_id = l.id AND r.status IN {ACTIVE_SQL})
                   OR NOT EXISTS (SELECT 1 FROM runlane.requests AS q
                                  WHERE q.lane_id = l.id AND q.status = 'queued')))
        AS pause_without_cause,
    -- An interrupted lane names its latest run, interrupted and not
    -- answered, and has no active run and no pause.
    EXISTS (SELECT 1 FROM runlane.lanes AS l
            JOIN runlane.runs AS i ON i.id = l.interrupted_run_id
            WHERE i.status <> 'interrupted' OR l.paused_run_id IS NOT NULL
               OR EXISTS (SELECT 1 FROM runlane.runs AS x WHERE x.resumed_from = i.id)
               OR EXISTS (SELECT 1 FROM runlane.runs AS r
                          WHERE r.lane_id = l.id AND r.status IN {ACTIVE_SQL}))
        AS interrupt_without_cause,
    -- Every attempt row names a stored run and one of its claims (no
    -- foreign key since migration 0027; deleted runs take theirs along).
    EXISTS (SELECT 1 FROM runlane.run_attempts AS a
            LEFT JOIN runlane.runs AS r ON r.id = a.run_id
            WHERE r.id IS NULL OR a.attempt < 1 OR a.attempt > r.claim_count)
        AS attempt_without_run,
    (SELECT count(*) FROM runlane.requests WHERE status = 'queued') AS queued
"""


# Bounded for CI: 40 examples of up to 30 steps, about 15 s. No example
# database (no .hypothesis directory in the tree): a failure prints its steps
# and a seed (--hypothesis-seed replays it). Shrinking against a database
# takes minutes (hypothesis gives up after five), so it only runs with
# RUNLANE_MODEL_SHRINK=1; the explain phase (tracing) never does.
SHRINK = os.environ.get("RUNLANE_MODEL_SHRINK") == "1"
CI_SETTINGS = hypothesis_settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.target] + ([Phase.shrink] if SHRINK else []),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.timeout(600 if SHRINK else 120)
def test_lanes_follow_the_model(db_url: str, settings: Settings) -> None:
    env = Env(db_url, settings)
    try:
        # A factory is fine (hypothesis documents it); the stub wants a class.
        run_state_machine_as_test(
            lambda: LaneMachine(env),  # type: ignore[arg-type]
            settings=CI_SETTINGS,
        )
    finally:
        env.close()


# -- paths the random search reaches only now and then --------------------------
#
# The same machine and checks, driven through fixed steps (the request ids are
# r0, r1, ... in submission order; runs are picked by their index in the
# model). Each step is followed by the full comparison with the model.


def submission(policy: str = "enqueue", *, lane: int = 0, **kwargs: Any) -> Submission:
    fields: dict[str, Any] = {
        "reuse": None,
        "same_input": True,
        "same_policy": True,
        "max_attempts": 2,
        "worker_first": False,
    }
    fields.update(kwargs)
    return Submission(lane=lane, policy=policy, **fields)


Step = Callable[[LaneMachine], None]


def step(action: Step, said: str | None) -> Step:
    """``action``, then (with ``said``) a check of how it ended."""

    def run(machine: LaneMachine) -> None:
        action(machine)
        if said is not None:
            assert machine.last == said, (machine.last, said)

    return run


def submit(policy: str = "enqueue", *, said: str | None = None, **kwargs: Any) -> Step:
    return step(lambda m: m.submit(submission(policy, **kwargs)), said)


def cancel_request(request_id: str, *, said: str | None = None) -> Step:
    return step(lambda m: m.cancel_request(request_id), said)


def claim(run: int) -> Step:
    return lambda m: m.claim(m.model.runs[run])


def active_pick(machine: LaneMachine, run: int) -> int:
    return machine.runs_in(ACTIVE).index(machine.model.runs[run])


def finish(run: int, outcome: str, *, said: str | None = None) -> Step:
    return step(lambda m: m.finish_active_run(pick=active_pick(m, run), outcome=outcome), said)


def interrupt(run: int, *, expires: bool = False) -> Step:
    return lambda m: m.interrupt_active_run(pick=active_pick(m, run), expires=expires)


def resume(run: int, value: str, *, said: str | None = None) -> Step:
    return step(lambda m: m.resume(m.model.runs[run], value), said)


def cancel_run(run: int, *, said: str | None = None) -> Step:
    return step(lambda m: m.cancel_run(m.model.runs[run]), said)


def crash(run: int) -> Step:
    def crash_run(machine: LaneMachine) -> None:
        runs = [r for r in machine.runs_in(("pending", "running")) if machine.model.queue(r.lane)]
        machine.crash_before_relay(pick=runs.index(machine.model.runs[run]))

    return crash_run


def recover(*, clock_jumps: bool = False, said: str | None = None) -> Step:
    return step(lambda m: m.recover(clock_jumps=clock_jumps), said)


def continue_lane(lane: int = 0, *, said: str | None = None) -> Step:
    return step(lambda m: m.continue_lane(lane=lane), said)


def expect_state(state: str, queued: list[str], lane: int = 0) -> Step:
    def check(m: LaneMachine) -> None:
        assert m.model.state(lane) == state
        assert [r.request_id for r in m.model.queue(lane)] == queued

    return check


SCENARIOS: dict[str, list[Step]] = {
    # An answered interrupt cannot be cancelled any more (its resume can):
    # the lane is not paused behind the resume's back.
    "cancel_a_resumed_interrupted_run": [
        submit(said="dispatched"),  # r0 -> run 0
        submit(said="queued"),  # r1
        interrupt(0),
        resume(0, "yes", said="created"),  # run 1, the lane's active run
        cancel_run(0, said="run_finished"),
        resume(0, "yes", said="existing"),
        resume(0, "no", said="resume_superseded"),
        expect_state("running", ["r1"]),
        finish(1, "completed"),  # the relay: r1 -> run 2
        expect_state("running", []),
        finish(2, "completed"),
        expect_state("idle", []),
    ],
    # A steer queued before an interrupt waits through the resume; the
    # resume is never asked to yield, so the steer can still be cancelled.
    "steer_queued_across_an_interrupt": [
        submit(),  # r0 -> run 0
        claim(0),
        submit(said="queued"),  # r1
        submit("steer", said="queued"),  # r2, first; run 0 is asked to yield
        expect_state("running", ["r2", "r1"]),
        cancel_request("r2", said="steer_in_progress"),
        interrupt(0),
        submit("steer", said="run_interrupted"),  # r3, never stored
        submit("reject", said="rejected run_interrupted"),  # r4
        resume(0, "yes", said="created"),  # run 1
        submit("steer", said="steer_already_pending"),  # r5
        cancel_request("r2", said="cancelled"),  # run 1 was never asked
        submit("steer", said="queued"),  # r6: run 1, a resume, is not asked
        expect_state("running", ["r6", "r1"]),
        finish(1, "completed"),  # the relay: the steer r6 -> run 2
        expect_state("running", ["r1"]),
    ],
    # A cancel wins over a steer; the paused lane keeps the steer first.
    "cancel_requested_run_meets_a_steer": [
        submit(),  # r0 -> run 0
        claim(0),
        submit(),  # r1 queued
        cancel_run(0, said="cancel_requested"),
        submit("steer", said="queued"),  # r2, run 0 is asked to yield
        lambda m: m.yield_to_steer(pick=0),  # ends cancelled: the lane pauses
        expect_state("paused", ["r2", "r1"]),
        submit("reject", said="rejected lane_paused"),  # r3
        submit(said="queued"),  # r4
        continue_lane(said="dispatched"),  # the steer r2 -> run 1
        continue_lane(said="run_active"),
        finish(1, "failed"),  # paused again, by run 1
        expect_state("paused", ["r1", "r4"]),
        cancel_request("r1", said="cancelled"),
        cancel_request("r4", said="cancelled"),  # the last one: the pause lifts
        expect_state("idle", []),
        continue_lane(said="queue_not_paused"),
    ],
    # Retries keep the lane busy and FIFO; used-up attempts pause it (dead),
    # and the other lane is untouched throughout.
    "retries_until_dead_beside_another_lane": [
        lambda m: m.choose_lanes(two=True),
        submit(max_attempts=2),  # r0 -> run 0
        submit(lane=1, said="dispatched"),  # r1 -> run 1, lane 1
        submit(said="queued"),  # r2
        finish(0, "retry", said="pending"),
        finish(0, "retry", said="dead"),
        expect_state("paused", ["r2"]),
        expect_state("running", [], lane=1),
        submit("steer", lane=1, said="queued"),  # r3 waits; run 1 is asked to yield
        continue_lane(said="dispatched"),  # r2 -> run 2
        finish(2, "completed"),
        expect_state("idle", []),
    ],
    # Only a crash (or an operator) leaves a lane idle with requests queued:
    # intake and recovery then dispatch its head.
    "idle_lane_with_a_queue": [
        submit(),  # r0 -> run 0
        submit(),  # r1 queued
        submit(),  # r2 queued
        crash(0),
        expect_state("idle", ["r1", "r2"]),
        submit("reject", said="rejected queue_not_empty"),  # r3
        continue_lane(said="queue_not_paused"),
        submit("steer", said="dispatched"),  # r4 goes first, at once
        expect_state("running", ["r1", "r2"]),
        crash(1),
        recover(said="1 dispatched, 0 expired"),  # r1 -> run 2
        recover(said="0 dispatched, 0 expired"),
        expect_state("running", ["r2"]),
    ],
    # An unanswered interrupt expires cancelled (the lane pauses behind it);
    # an answered one never does.
    "interrupt_expiry": [
        lambda m: m.choose_lanes(two=True),
        submit(),  # r0 -> run 0
        submit(),  # r1 queued
        interrupt(0, expires=True),
        submit(lane=1),  # r2 -> run 1, lane 1
        interrupt(1, expires=True),
        resume(1, "yes", said="created"),  # run 2: run 1 no longer expires
        recover(clock_jumps=True, said="0 dispatched, 1 expired"),  # run 0
        expect_state("paused", ["r1"]),
        expect_state("running", [], lane=1),
        cancel_run(0, said="cancelled"),  # already: returned as it is
        resume(0, "late", said="not_interrupted"),
    ],
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_model_on_fixed_paths(db_url: str, settings: Settings, name: str) -> None:
    env = Env(db_url, settings)
    try:
        machine = LaneMachine(env)
        machine.choose_lanes(two=False)
        machine.system_matches_model()
        for step in SCENARIOS[name]:
            step(machine)
            machine.system_matches_model()
    finally:
        env.close()
