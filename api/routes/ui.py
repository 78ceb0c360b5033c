"""/dashboard: the web dashboard, a static page and its assets (api/static/dashboard/).

The page holds no data and needs no login to load: it asks for a key in the browser
and reads the JSON routes (/v1/dashboard/..., a batch's events) with it, sent as an
``Authorization`` header only. Everything it loads comes from this origin, which its
Content-Security-Policy enforces (no inline script or style, no other host).
"""

from __future__ import annotations

from pathlib import Path

from flask import Response, send_from_directory

from api.routes.contract import Blueprint

bp = Blueprint("ui", __name__)
ROOT = Path(__file__).resolve().parent.parent / "static" / "dashboard"
CSP = "; ".join((
    "default-src 'none'", "script-src 'self'", "style-src 'self'", "img-src 'self'",
    "connect-src 'self'", "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'",
))
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}


def _secured(resp: Response) -> Response:
    # no-cache: revalidated (ETag) on every load, so a new release's files are never mixed
    # with an old one's (the assets have no content hashes in their names).
    resp.headers.update(HEADERS)
    resp.headers["Cache-Control"] = "no-cache"
    return resp


@bp.get("/dashboard")
def page() -> Response:
    return _secured(send_from_directory(ROOT, "index.html", mimetype="text/html"))


@bp.get("/dashboard/static/<path:asset>")
def asset(asset: str) -> Response:
    """The page's scripts, styles and icon; a name outside the folder is 404."""
    return _secured(send_from_directory(ROOT, asset))
