"""Redacts secrets from text before it is stored or shown: bearer tokens,
runlane API keys, passwords in URLs and ``password=`` settings."""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"

_PATTERNS = [
    # Authorization: Bearer <token>
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {REDACTED}"),
    # runlane API keys
    (re.compile(r"\brl_[0-9a-f]{8}_[A-Za-z0-9_-]{20,}"), REDACTED),
    # scheme://user:password@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]+):[^\s@/]+@"), rf"\1:{REDACTED}@"),
    # password=..., passwd: ..., secret=..., api_key=..., token=...
    (
        re.compile(
            r"(?i)\b(password|passwd|pwd|secret|api[_-]?key|access[_-]?token|token)"
            r"([\"']?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&\"']+)"
        ),
        rf"\1\2{REDACTED}",
    ),
]


def redact_text(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact(value: Any) -> Any:
    """Redacts every string inside a JSON-like value (keys are kept)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {key: redact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value
