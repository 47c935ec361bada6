"""The run queue's records."""

from __future__ import annotations

import typing
from datetime import datetime
from uuid import UUID

from runlane import models


def test_run_from_json_converts_every_uuid_and_time_field() -> None:
    # Run.from_json turns to_json's text back into the types psycopg
    # gives: every UUID and datetime field of Run must be listed.
    hints = typing.get_type_hints(models.Run)

    def fields_of(kind: type) -> set[str]:
        return {
            name for name, hint in hints.items() if hint is kind or kind in typing.get_args(hint)
        }

    assert set(models._UUID_FIELDS) == fields_of(UUID)
    assert set(models._DATETIME_FIELDS) == fields_of(datetime)
