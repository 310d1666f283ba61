"""Dependencies every route shares: the services and the caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from flowhook.service import Principal, Services

__all__ = ["ServicesDep", "CallerDep", "get_services", "caller"]

_bearer = HTTPBearer(auto_error=False, description="A sandbox (sk_test_…) or live (sk_live_…) key.")


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def caller(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    services = get_services(request)
    return await services.keys.authenticate(request.headers.get("authorization"))


ServicesDep = Annotated[Services, Depends(get_services)]
CallerDep = Annotated[Principal, Depends(caller)]
