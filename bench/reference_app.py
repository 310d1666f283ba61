"""The reference for the accept benchmark: Flowhook's own app on the same server stack
(uvicorn with uvloop and httptools, the same middleware, FastAPI), plus one empty endpoint,
``POST /bench/empty``, that parses the same body with the same Pydantic model and answers a
constant 202 without authenticating or touching the store. Accept divided by this is how
much of the stack's bare request rate an accepted, durable run keeps.

    .venv/bin/python bench/reference_app.py      # reads FLOWHOOK_* like `flowhook serve`
"""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI
from starlette.responses import Response

from flowhook.api.app import create_app
from flowhook.api.models import ExecuteRequest
from flowhook.api.responses import ORJSONResponse
from flowhook.config import Settings
from flowhook.gctune import tune_for_server

ACCEPTED = {"run_id": "run_0", "flow_id": "wf_0", "status": "queued", "queued_at": ""}


def build(settings: Settings) -> FastAPI:
    app = create_app(settings, run_worker=False)

    @app.post("/bench/empty", status_code=202)
    async def empty(body: ExecuteRequest) -> Response:
        return ORJSONResponse({**ACCEPTED, "flow_id": body.flow_id}, status_code=202)

    return app


def main() -> None:
    settings = Settings()
    tune_for_server()  # as `flowhook serve` does
    uvicorn.Server(  # the options `flowhook serve` uses
        uvicorn.Config(
            build(settings),
            host=settings.host,
            port=settings.port,
            loop="uvloop",
            http="httptools",
            log_level=settings.log_level,
            access_log=False,
            lifespan="on",
            log_config=None,
        )
    ).run()


if __name__ == "__main__":
    main()
