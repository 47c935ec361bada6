from __future__ import annotations

import pytest

from runlane.redaction import REDACTED, redact, redact_text


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Authorization: Bearer abcdefghijklmnop123", "abcdefghijklmnop123"),
        ("connect postgresql://app:s3cr3t@db:5432/prod failed", "s3cr3t"),
        ("password=hunter2 rejected", "hunter2"),
        ('{"api_key": "sk-live-123456"}', "sk-live-123456"),
        ("token: ghp_abcdef123456", "ghp_abcdef123456"),
        ("key rl_0a1b2c3d_AbCdEfGhIjKlMnOpQrStUvWxYz012345 leaked", "AbCdEfGhIjKlMnOp"),
    ],
)
def test_secrets_are_redacted(text: str, secret: str) -> None:
    cleaned = redact_text(text)
    assert secret not in cleaned and REDACTED in cleaned


def test_plain_text_is_left_alone() -> None:
    text = "the model said: password reset links expire in 1 hour"
    assert redact_text(text) == text


def test_nested_values_are_redacted_and_keys_kept() -> None:
    value = {"headers": ["Bearer abcdefghijklmnop"], "n": 3, "ok": True}
    assert redact(value) == {"headers": [f"Bearer {REDACTED}"], "n": 3, "ok": True}
