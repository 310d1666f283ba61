"""Dependencies every API route shares: the services (:mod:`flowhook.serving.deps`, which the
pages use too) and the caller, by its key."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from flowhook.service import Principal
from flowhook.serving.deps import ServicesDep, get_services

__all__ = ["ServicesDep", "CallerDep", "get_services", "caller"]

_bearer = HTTPBearer(auto_error=False, description="A sandbox (sk_test_…) or live (sk_live_…) key.")


async def caller(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    services = get_services(request)
    return await services.keys.authenticate(request.headers.get("authorization"))


CallerDep = Annotated[Principal, Depends(caller)]
