"""``/api/v1/docs``: the OpenAPI document rendered by Swagger UI, served from this package
(flowhook/web/static/swagger, swagger-ui-dist 5, Apache-2.0: its LICENSE and NOTICE beside
it), so the page works behind a firewall; FastAPI's own page loads it from a CDN. No inline
script: the page's start is static/swagger/start.js."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import HTMLResponse

__all__ = ["install_docs", "DOCS_PATH", "DOCS_CSP"]

DOCS_PATH = "/api/v1/docs"
DOCS_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'; form-action 'self'"
)
"""Its own files only; Swagger UI sets style attributes (``'unsafe-inline'`` styles, no
script)."""

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Flowhook API</title>
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/static/swagger/swagger-ui.css">
</head>
<body>
<div id="swagger-ui" data-openapi="/api/v1/openapi.json"></div>
<script src="/static/swagger/swagger-ui-bundle.js"></script>
<script src="/static/swagger/start.js"></script>
</body>
</html>
"""


def install_docs(app: FastAPI) -> None:
    """Serve the docs page (the app is made with ``docs_url=None``)."""

    async def docs(request: Request) -> HTMLResponse:
        return HTMLResponse(
            _PAGE,
            headers={
                "Content-Security-Policy": DOCS_CSP,
                "X-Frame-Options": "DENY",
                "X-Content-Type-Options": "nosniff",
            },
        )

    app.add_route(DOCS_PATH, docs, methods=["GET"], include_in_schema=False)
