"""The run queue's records."""

from __future__ import annotations

import typing
import uuid
from datetime import UTC, datetime
from uuid import UUID

from runlane import models


def test_a_pushed_runs_json_gives_every_id_and_time_its_type() -> None:
    # A push's NOTIFY carries the run as PostgreSQL writes it in JSON: ids
    # and times as text. ClaimedRun.from_pushed_json must turn each field
    # typed UUID or datetime back into that type, as a claim's row has it.
    hints = typing.get_type_hints(models.ClaimedRun)

    def typed(kind: type) -> set[str]:
        return {
            name for name, hint in hints.items() if hint is kind or kind in typing.get_args(hint)
        }

    row: dict[str, typing.Any] = {
        name: 1 for name in hints if name not in ("deadline_in_seconds", "pushed")
    }
    for name in typed(UUID):
        row[name] = str(uuid.uuid4())
    for name in typed(datetime):
        row[name] = datetime.now(UTC).isoformat()
    claimed = models.ClaimedRun.from_pushed_json(row, 12.5)
    for name in typed(UUID):
        assert isinstance(getattr(claimed, name), UUID), name
        assert str(getattr(claimed, name)) == row[name]
    for name in typed(datetime):
        assert isinstance(getattr(claimed, name), datetime), name
        assert getattr(claimed, name).isoformat() == row[name]
    assert claimed.pushed and claimed.deadline_in_seconds == 12.5
    assert typed(UUID) == {"id", "lease_token"} and typed(datetime) == {"steer_requested_at"}
