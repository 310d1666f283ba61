"""The app's services as a FastAPI dependency, for the API's routes and the pages alike."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from flowhook.service import Services

__all__ = ["ServicesDep", "get_services"]


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]
