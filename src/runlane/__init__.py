"""runlane: durable runs for AI agents on PostgreSQL."""

from runlane.app import App
from runlane.context import RunContext
from runlane.errors import (
    InvalidInput,
    NotFound,
    NotRetryable,
    PayloadTooLarge,
    RunFinished,
    RunlaneError,
)
from runlane.models import Run, RunStatus
from runlane.outcomes import (
    BudgetExceeded,
    Fail,
    LeaseLost,
    Retry,
    RunCancelled,
    ShutdownRequested,
)
from runlane.settings import Settings

__version__ = "0.1.0"

__all__ = [
    "App",
    "BudgetExceeded",
    "Fail",
    "InvalidInput",
    "LeaseLost",
    "NotFound",
    "NotRetryable",
    "PayloadTooLarge",
    "Retry",
    "Run",
    "RunCancelled",
    "RunContext",
    "RunFinished",
    "RunStatus",
    "RunlaneError",
    "Settings",
    "ShutdownRequested",
]
