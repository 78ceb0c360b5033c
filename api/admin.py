"""/v1/organization: the Admin API's projects, service accounts, keys and rate limits."""

from __future__ import annotations

from flask import Blueprint

bp = Blueprint("admin", __name__)
