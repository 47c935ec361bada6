"""Bearer API keys: who a request acts for."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from runlane.api.errors import ApiError
from runlane.keys import Principal

# Declares bearer auth in the OpenAPI document (the Authorize button of
# /docs); the check itself is ours, so that errors keep our format.
bearer_scheme = HTTPBearer(auto_error=False, description="An API key: runlane keys create")


async def principal(
    request: Request,
    _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _sep, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError("unauthorized", "send 'Authorization: Bearer <api key>'")
    found = await request.app.state.runlane.keys.authenticate(key.strip())
    if found is None:
        raise ApiError("unauthorized", "unknown or revoked API key")
    assert isinstance(found, Principal)
    return found


async def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    if not who.admin:
        raise ApiError("forbidden", "this needs an admin key")
    return who


Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]
