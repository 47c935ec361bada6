"""Errors with stable, machine-readable codes.

Adapters map them: the CLI prints one line and exits non-zero; the HTTP API
answers ``{"error": {"code", "message"}}`` with a fitting status.
"""

from __future__ import annotations


class RunlaneError(Exception):
    """Base of every error runlane raises on purpose."""

    code = "runlane_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(RunlaneError):
    code = "not_found"


class InvalidInput(RunlaneError):
    code = "validation_error"


class PayloadTooLarge(RunlaneError):
    code = "payload_too_large"


class RunFinished(RunlaneError):
    """The operation needs an unfinished run, and the run has ended."""

    code = "run_finished"


class NotRetryable(RunlaneError):
    """Only failed or dead runs can be re-queued."""

    code = "not_retryable"


class LaneRefused(RunlaneError):
    """A lane refused the operation; ``code`` says why (see
    :class:`runlane.lanes.Refusal`). Nothing was stored."""

    def __init__(self, code: str, message: str, *, run_id: object = None) -> None:
        super().__init__(message)
        self.code = str(code)
        self.run_id = run_id


class DatabaseUnavailable(RunlaneError):
    code = "database_unavailable"
