"""The agent registry a worker serves."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runlane.execution import Handler
from runlane.settings import Settings

if TYPE_CHECKING:
    from runlane.langgraph_agent import LangGraphAgent


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

    def langgraph(
        self, name: str, build_graph: Callable[[Any], Any], **options: Any
    ) -> LangGraphAgent:
        """Registers agent ``name`` that runs a LangGraph graph:
        ``build_graph(checkpointer)`` returns it compiled with that
        checkpointer. Needs ``pip install runlane[langgraph]``; the options
        are :class:`~runlane.langgraph_agent.LangGraphAgent`'s."""
        try:
            from runlane.langgraph_agent import LangGraphAgent
        except ImportError as exc:
            raise ImportError(
                f"app.langgraph() needs LangGraph: pip install 'runlane[langgraph]' ({exc})"
            ) from exc

        options.setdefault("settings", lambda: self.settings)
        handler = LangGraphAgent(build_graph, **options)
        self.agent(name)(handler)
        return handler
