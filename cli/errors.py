"""What a CLI user sees when a command fails for a reason they can fix: one line that
says what to do, never a traceback. ``cli.main`` routes every exception through
:func:`user_message`; anything it does not recognise is a bug and keeps its traceback."""

from __future__ import annotations

from typing import Any

START_HINT = "start it with `inferq up`, or pass --api-url (INFERQ_API_URL)"
KEY_HINT = ("pass --api-key (INFERQ_API_KEY) with a key from `inferq keys create --project "
            "ID`, or the dev key that `inferq up` wrote to the data dir")
ADMIN_KEY_HINT = ("pass --admin-key (INFERQ_ADMIN_KEY), or use the admin key that `inferq up` "
                  "wrote to the data dir (admin-api-key)")


def user_message(exc: BaseException) -> str | None:
    """The one-line message for an error the user can act on; None for a bug."""
    for handler in (_openai_message, _backend_message, _local_message):
        msg = handler(exc)
        if msg is not None:
            return msg
    return None


def _openai_message(exc: BaseException) -> str | None:
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return f"the inferq API at {_base(exc)} did not answer in time; try again"
    if isinstance(exc, openai.APIConnectionError):
        return f"cannot reach the inferq API at {_base(exc)}: {START_HINT}"
    if isinstance(exc, openai.AuthenticationError):
        if _is_admin(exc):
            return f"the API refused the admin key ({_api_text(exc)}): {ADMIN_KEY_HINT}"
        return f"the API refused the API key ({_api_text(exc)}): {KEY_HINT}"
    if isinstance(exc, openai.NotFoundError) and not _under_v1(exc):
        return (f"the API has no route {_path(exc)} (HTTP 404): its routes are "
                "under /v1; pass the …/v1 base URL as --api-url (INFERQ_API_URL)")
    if isinstance(exc, openai.APIStatusError):
        return f"{_api_text(exc)} (HTTP {exc.status_code})"
    if isinstance(exc, openai.APIError):
        return f"unexpected answer from the inferq API: {exc.message}"
    return None


def _backend_message(exc: BaseException) -> str | None:
    import redis
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.OperationalError):
        return (f"cannot reach the database ({_first_line(exc.orig or exc)}): is `inferq up` "
                "running on this data dir (INFERQ_DATA_DIR), or is INFERQ_DATABASE_URL right?")
    if isinstance(exc, redis.exceptions.ConnectionError):
        return (f"cannot reach Redis ({_first_line(exc)}): is `inferq up` running on this data "
                "dir (INFERQ_DATA_DIR), or is INFERQ_REDIS_URL right?")
    return None


def _local_message(exc: BaseException) -> str | None:
    """This machine: a file the command reads or writes, a child that ran too long, a
    stack that cannot start."""
    import subprocess

    from cli.stack import StackError

    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or _first_line(exc)}"
    if isinstance(exc, subprocess.TimeoutExpired):
        cmd = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd))
        return f"`{cmd}` did not finish in {exc.timeout:g} s and was stopped"
    if isinstance(exc, StackError):
        return str(exc)
    return None


def _api_text(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return str(exc.message)


def _path(exc: Any) -> str | None:
    """The refused request's URL path; None when no request is attached."""
    try:
        return str(exc.request.url.path)
    except RuntimeError:
        return None


def _is_admin(exc: Any) -> bool:
    """Whether the refused request went to the Admin API (/v1/organization/...)."""
    return "/organization/" in (_path(exc) or "")


def _under_v1(exc: Any) -> bool:
    """Whether the request went to a /v1 route (an --api-url without /v1 sends it
    elsewhere); True when no request is attached."""
    path = _path(exc)
    return path is None or "/v1/" in path


def _base(exc: Any) -> str:
    try:
        url = exc.request.url
    except RuntimeError:  # no request attached
        return "its URL"
    path = url.path.split("/v1/", 1)[0]
    return f"{url.scheme}://{url.netloc.decode()}{path}/v1"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
