"""/v1/organization/usage/* and /v1/organization/costs: the Admin API's usage and costs."""

from __future__ import annotations

from flask import Blueprint

bp = Blueprint("usage", __name__)
