"""The HTTP API (v1): a thin adapter over the service layer."""

from runlane.api.app import create_app

__all__ = ["create_app"]
