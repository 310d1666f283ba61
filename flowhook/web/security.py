"""What pages send and check beyond the session: framing and content rules, the origin of a
sign-in, and when the session cookie is ``Secure``."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import Request

from flowhook.config import Settings

__all__ = ["PAGE_HEADERS", "CSP", "foreign_origin", "secure_cookie"]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
"""Pages load only their own static script and stylesheet; nothing inline, no framing."""

PAGE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
"""Sent with every answer outside ``/api/`` (pages, their static files, their errors)."""

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an absolute http(s) URL, or ``None``."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def foreign_origin(request: Request, public_url: str | None) -> str | None:
    """Why a form post did not come from one of our own pages, or ``None`` when it did.

    Browsers send ``Origin`` with every POST (``Referer`` stands in when a very old one does
    not); it must be this site as the request addressed it (scheme as uvicorn sees it, Host)
    or ``FLOWHOOK_PUBLIC_URL``. A post with neither header is refused too: only a browser
    signs in, and a browser says where the form was.
    """
    ours = {_origin(f"{request.url.scheme}://{request.headers.get('host', '')}")}
    if public_url:
        ours.add(_origin(public_url))
    ours.discard(None)
    sent = request.headers.get("origin") or request.headers.get("referer")
    if not sent:
        return "the browser did not say which page sent the form"
    if _origin(sent) not in ours:
        shown = sent if len(sent) <= 100 else sent[:100] + "…"
        return f"the form was sent from another site ({shown})"
    return None


def secure_cookie(request: Request, settings: Settings) -> bool:
    """``Secure`` when FLOWHOOK_SECURE_COOKIES says so or the request came over https as
    uvicorn decided it (X-Forwarded-Proto counts only from proxies uvicorn trusts)."""
    return settings.secure_cookies or request.url.scheme == "https"
