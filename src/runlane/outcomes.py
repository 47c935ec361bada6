"""Exceptions that end an attempt.

A handler raises :class:`Retry` or :class:`Fail` on purpose. The others are
raised *into* a handler by :meth:`RunContext.safe_point` (and the fenced
writes) to stop its work; a handler should let them propagate.
"""

from __future__ import annotations

# The longest wait runlane accepts anywhere (a delay, a retry, a budget, an
# interrupt's expiry): one year. Longer values overflow timestamps.
MAX_DELAY_SECONDS = 365 * 24 * 3600


class Retry(Exception):
    """Ask for another attempt, after ``delay`` seconds (default: backoff)."""

    def __init__(self, message: str = "retry requested", *, delay: float | None = None) -> None:
        super().__init__(message)
        if delay is not None and not 0 <= delay <= MAX_DELAY_SECONDS:
            raise ValueError(f"delay must be between 0 and {MAX_DELAY_SECONDS} seconds")
        self.delay = delay


class Fail(Exception):
    """End the run ``failed`` with a code; never retried."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class StopRun(BaseException):
    """Base of the stop signals. A BaseException, so that a handler's broad
    ``except Exception`` does not swallow a cancel or a lost lease."""


class RunCancelled(StopRun):
    """A cancel request reached the run."""


class LeaseLost(StopRun):
    """This worker no longer holds the run's lease: its writes are refused."""


class BudgetExceeded(StopRun):
    """The run's budget (deadline, turns) is spent."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class ShutdownRequested(StopRun):
    """The worker is shutting down; the run is released for another worker."""


class Steered(StopRun):
    """A steer arrived for the run's lane: the run ends completed (outcome
    ``steered``) and the steer runs next."""


class Interrupted(StopRun):
    """Raised by :meth:`RunContext.interrupt`: the run ends ``interrupted``,
    waiting for a human; a resume starts a new run with the answer."""

    def __init__(self, payload: object, expires_in: float | None) -> None:
        super().__init__("interrupted")
        self.payload = payload
        self.expires_in = expires_in
