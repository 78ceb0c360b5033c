"""/v1/webhook_endpoints: a project's webhook endpoints, as the ``openai`` SDK's
``client.webhooks`` calls them (create, retrieve, update, list, delete, rotate_secret,
test; ``/v1/webhook_event_types``), plus inferq extensions: an endpoint's delivery log
(``GET .../deliveries``), resending a delivery (``POST .../deliveries/{id}/resend``)
and the project's secret for per-request callbacks (``/v1/webhook_callback_secret``)."""

from __future__ import annotations

from flask import g, request

from api.current import context
from api.request_parsing import ID, json_body, optional_json_body, page_params
from api.routes.contract import PAGE, Blueprint
from jobs.core.errors import InvalidRequest, NotFound, shown
from jobs.protocol.objects.common import Deleted, Page
from jobs.protocol.objects.webhooks import (
    CallbackSecret,
    CallbackSecretWithSecret,
    Delivery,
    EventTypeList,
    WebhookEndpoint,
    WebhookEndpointWithSecret,
    WebhookTestResult,
)
from jobs.protocol.validation import parse_model
from jobs.webhooks import deliveries as outbox
from jobs.webhooks import endpoints
from jobs.webhooks import events as webhooks
from jobs.webhooks.signing import secret_hint

bp = Blueprint("webhooks", __name__, access="project")

PATH_IDS = {"webhook_endpoint_id": "webhook endpoint", "delivery_id": "delivery"}


@bp.before_request
def _check_path_ids() -> None:
    """An id no object can have is a 404 before any lookup (PostgreSQL refuses NUL)."""
    for name, value in (request.view_args or {}).items():
        if name in PATH_IDS and not ID.fullmatch(value):
            raise NotFound(f"No such {PATH_IDS[name]}: {shown(value)}", param=name)


@bp.post("/webhook_endpoints", body=endpoints.EndpointCreate)
def create() -> WebhookEndpointWithSecret:
    req = parse_model(endpoints.EndpointCreate, json_body())
    e = endpoints.create_endpoint(context(), g.tenant_id, req)
    return WebhookEndpointWithSecret.of(e, secret_hint(e.secret))


@bp.get("/webhook_endpoints", params=PAGE)
def list_() -> Page[WebhookEndpoint]:
    after, limit = page_params()
    rows, more = endpoints.list_endpoints(context(), g.tenant_id, after, limit)
    return Page[WebhookEndpoint].of(
        [WebhookEndpoint.of(e, secret_hint(e.secret)) for e in rows], more)


@bp.get("/webhook_endpoints/<webhook_endpoint_id>")
def retrieve(webhook_endpoint_id: str) -> WebhookEndpoint:
    e = endpoints.get_endpoint(context(), g.tenant_id, webhook_endpoint_id)
    return WebhookEndpoint.of(e, secret_hint(e.secret))


@bp.post("/webhook_endpoints/<webhook_endpoint_id>", body=endpoints.EndpointUpdate,
         optional_body=True)
def update(webhook_endpoint_id: str) -> WebhookEndpoint:
    req = parse_model(endpoints.EndpointUpdate, optional_json_body())
    e = endpoints.update_endpoint(context(), g.tenant_id, webhook_endpoint_id, req)
    return WebhookEndpoint.of(e, secret_hint(e.secret))


@bp.delete("/webhook_endpoints/<webhook_endpoint_id>")
def delete(webhook_endpoint_id: str) -> Deleted:
    endpoints.delete_endpoint(context(), g.tenant_id, webhook_endpoint_id)
    return Deleted(id=webhook_endpoint_id, object="webhook_endpoint.deleted", deleted=True)


@bp.post("/webhook_endpoints/<webhook_endpoint_id>/rotate_secret", body=endpoints.RotateSecret,
         optional_body=True)
def rotate_secret(webhook_endpoint_id: str) -> WebhookEndpointWithSecret:
    req = parse_model(endpoints.RotateSecret, optional_json_body())
    e = endpoints.rotate_secret(context(), g.tenant_id, webhook_endpoint_id,
                               req.keep_old_secret_active_for_24_hours)
    return WebhookEndpointWithSecret.of(e, secret_hint(e.secret))


@bp.post("/webhook_endpoints/<webhook_endpoint_id>/test", body=endpoints.TestSend)
def test(webhook_endpoint_id: str) -> WebhookTestResult:
    """A result (``success: true``) only for a test that delivered, by the rule of every
    delivery (a 2xx answer); any other answer is a 400 ``webhook_test_failed`` saying
    what the endpoint answered, no answer at all a 400 ``webhook_unreachable``."""
    e = endpoints.get_endpoint(context(), g.tenant_id, webhook_endpoint_id)
    req = parse_model(endpoints.TestSend, json_body())
    outcome = outbox.send_test(context(), e, req.event_type)
    if outcome.status is None:
        raise InvalidRequest(f"the endpoint did not answer: {outcome.error}",
                             param="webhook_endpoint_id", code="webhook_unreachable")
    if not outcome.delivered:
        raise InvalidRequest(f"the test event was not delivered: {outcome.failure}",
                             param="webhook_endpoint_id", code="webhook_test_failed")
    return WebhookTestResult(webhook_endpoint_id=webhook_endpoint_id,
                             event_type=req.event_type, status_code=outcome.status,
                             success=True)


@bp.get("/webhook_event_types")
def event_types() -> EventTypeList:
    return EventTypeList(data=list(webhooks.EVENT_TYPES))


@bp.get("/webhook_endpoints/<webhook_endpoint_id>/deliveries", params=PAGE)
def deliveries(webhook_endpoint_id: str) -> Page[Delivery]:
    after, limit = page_params()
    rows, more = endpoints.list_deliveries(context(), g.tenant_id, webhook_endpoint_id, after,
                                          limit)
    return Page[Delivery].of([Delivery.of(*r) for r in rows], more)


@bp.post("/webhook_endpoints/<webhook_endpoint_id>/deliveries/<delivery_id>/resend")
def resend(webhook_endpoint_id: str, delivery_id: str) -> Delivery:
    return Delivery.of(
        *endpoints.resend(context(), g.tenant_id, webhook_endpoint_id, delivery_id))


@bp.get("/webhook_callback_secret", errors={404})
def callback_secret() -> CallbackSecret:
    row = endpoints.get_callback_secret(context(), g.tenant_id)
    return CallbackSecret.of(row, secret_hint(row.secret))


@bp.post("/webhook_callback_secret", body=endpoints.RotateSecret, optional_body=True)
def rotate_callback_secret() -> CallbackSecretWithSecret:
    req = parse_model(endpoints.RotateSecret, optional_json_body())
    row = endpoints.rotate_callback_secret(context(), g.tenant_id,
                                          req.keep_old_secret_active_for_24_hours)
    return CallbackSecretWithSecret.of(row, secret_hint(row.secret))
