"""The run queue's records."""

from __future__ import annotations

import typing
import uuid
from datetime import UTC, datetime
from uuid import UUID

import pytest

from runlane import models


@pytest.mark.parametrize("shape", ["claim", "run"])
def test_a_pushed_runs_json_gives_every_id_and_time_its_type(shape: str) -> None:
    # A push's NOTIFY carries the run as PostgreSQL writes it in JSON: ids
    # and times as text; as the claim's columns in an array, or, from a
    # database before migration 0046, as the run's row. Both decoders must
    # turn each field typed UUID or datetime back into that type, as a
    # claim's row has it.
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
    if shape == "claim":
        # In the class's order: a column out of place fails its type here.
        claimed = models.ClaimedRun.from_pushed_claim(list(row.values()), 12.5)
    else:
        claimed = models.ClaimedRun.from_pushed_json(row, 12.5)
    for name in typed(UUID):
        assert isinstance(getattr(claimed, name), UUID), name
        assert str(getattr(claimed, name)) == row[name]
    for name in typed(datetime):
        assert isinstance(getattr(claimed, name), datetime), name
        assert getattr(claimed, name).isoformat() == row[name]
    assert claimed.pushed and claimed.deadline_in_seconds == 12.5
    assert typed(UUID) == {"id", "lease_token"} and typed(datetime) == {"steer_requested_at"}


def test_a_pushed_claim_of_another_width_is_refused() -> None:
    # A payload of another version's columns is not guessed at: the worker
    # treats it as unreadable and claims the run by unparking.
    with pytest.raises(ValueError, match="columns"):
        models.ClaimedRun.from_pushed_claim([str(uuid.uuid4())] * 3, None)
