"""The agent registry a worker serves."""

from __future__ import annotations

from collections.abc import Callable

from runlane.execution import Handler
from runlane.settings import Settings


class App:
    """Agents by name. ``@app.agent("name")`` registers an async handler
    taking a :class:`~runlane.context.RunContext`."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._settings = settings
        self.agents: dict[str, Handler] = {}

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = Settings()
        return self._settings

    def agent(self, name: str) -> Callable[[Handler], Handler]:
        if not name or not name.strip():
            raise ValueError("an agent needs a name")

        def register(handler: Handler) -> Handler:
            if name in self.agents:
                raise ValueError(f"agent {name!r} is already registered")
            self.agents[name] = handler
            return handler

        return register
