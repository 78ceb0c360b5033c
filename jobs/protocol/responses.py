"""The Responses API's objects (/v1/responses), built from a chat answer: the Response
object, shared by the API (interactive answers) and the workers (jobs, batch output
lines), and the events of a streamed one.

A Response echoes the request's settings (``instructions``, ``metadata``,
``temperature``, ``top_p``, ``max_output_tokens``, ``user``, ``tools``,
``tool_choice``, ``parallel_tool_calls``) and states what inferq does with the
parameters it takes only at their no-op values (no reasoning, text format, no
truncation, not stored), with every field the pinned SDK's ``Response`` requires, so
that strict response validation passes.

With function tools, the answer's calls are read back from its text
(jobs.protocol.tool_calls): each is a ``function_call`` output item after the message
(which is left out when only calls were written).
"""

from __future__ import annotations

import time
from typing import Any

from jobs.core.schema import new_id
from jobs.protocol.objects.inference import (
    FunctionCallItem,
    IncompleteDetails,
    ItemStatus,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponseText,
    ResponseUsage,
)
from jobs.protocol.responses_request import ResponsesBody, chat_body
from jobs.protocol.tool_calls import Call, CallStream, parse
from jobs.protocol.tool_use import Tools, tools_of

COMPLETED: ItemStatus = "completed"
INCOMPLETE: ItemStatus = "incomplete"
IN_PROGRESS: ItemStatus = "in_progress"


def response_id() -> str:
    return new_id("resp_")


def message_id() -> str:
    return new_id("msg_")


def call_item_id() -> str:
    return new_id("fc_")


def response_tools(req: ResponsesBody) -> Tools | None:
    """The request's tools as they are used (None: none, or ``tool_choice: none``)."""
    return tools_of(chat_body(req)) if req.tools else None


def function_call(call: Call, item_id: str, status: ItemStatus) -> FunctionCallItem:
    """A call as an output item; ``status`` in_progress: its arguments not sent yet."""
    return FunctionCallItem(id=item_id, call_id=call.id, name=call.name, status=status,
                            arguments="" if status == IN_PROGRESS else call.arguments)


def status_of(finish_reason: str | None) -> ItemStatus:
    """The Response's status for the chat answer's finish reason: ``length`` (the
    token limit, or the end of the context) is ``incomplete``."""
    return INCOMPLETE if finish_reason == "length" else COMPLETED


def output_message(mid: str, text: str | None, status: ItemStatus) -> OutputMessage:
    """The answer's one output item; ``text`` None: none of its content yet."""
    return OutputMessage(id=mid, status=status,
                         content=[] if text is None else [OutputText(text=text)])


def response_object(req: ResponsesBody, *, rid: str, created_at: int, status: ItemStatus,
                    output: list[OutputMessage | FunctionCallItem], use: ResponseUsage | None,
                    completed_at: int | None = None) -> ResponseObject:
    return ResponseObject(
        id=rid, created_at=created_at, status=status, completed_at=completed_at,
        incomplete_details=IncompleteDetails() if status == INCOMPLETE else None,
        instructions=req.instructions, max_output_tokens=req.max_output_tokens,
        metadata=dict(req.metadata or {}), model=req.model, output=output,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        temperature=req.temperature, text=ResponseText(format=text_format(req)),
        tool_choice=tool_choice(req), tools=[t.echoed() for t in req.tools or []],
        top_p=req.top_p, usage=use, user=req.user)


def tool_choice(req: ResponsesBody) -> Any:
    """The request's ``tool_choice`` as the Response echoes it (``auto`` with tools,
    ``none`` without, when not given)."""
    c = req.tool_choice
    if c is None:
        return "auto" if req.tools else "none"
    return c if isinstance(c, str) else c.model_dump()


def text_format(req: ResponsesBody) -> dict[str, Any]:
    """The request's ``text.format`` as the Response echoes it."""
    if req.text is None or req.text.format is None:
        return {"type": "text"}
    return req.text.format.model_dump(exclude_none=True)


def response_body(req: ResponsesBody, text: str, finish_reason: str, prompt_tokens: int,
                  completion_tokens: int, rid: str | None = None,
                  created_at: int | None = None) -> dict[str, Any]:
    """The whole Response of a chat answer (its text, finish reason and usage), as
    sent."""
    now = int(time.time())
    status = status_of(finish_reason)
    tools = response_tools(req)
    content, calls = parse(text, tools) if tools is not None else (text, [])
    output: list[OutputMessage | FunctionCallItem] = (
        [] if content is None else [output_message(message_id(), content, status)])
    output += [function_call(c, call_item_id(), COMPLETED) for c in calls]
    return response_object(req, rid=rid or response_id(), created_at=created_at or now,
                           status=status, output=output,
                           use=ResponseUsage.of(prompt_tokens, completion_tokens),
                           completed_at=now).body()


class EventWriter:
    """The events of one streamed Response, in the Responses API's order, each with
    the next ``sequence_number``: ``start`` (response.created, response.in_progress,
    and without tools the output message and its content part added), ``delta`` for
    each piece of text, ``finish`` (the text, part and item done, then
    response.completed or response.incomplete) and ``error``. Each event is (its name,
    its data).

    With tools the text goes through a ``CallStream``: the message is added when its
    first text is known, and each call is an output item of its own, added, its
    arguments (whole: one delta), done."""

    def __init__(self, req: ResponsesBody) -> None:
        self.req = req
        self.id, self.message_id = response_id(), message_id()
        self.created_at = int(time.time())
        self.seq = 0
        self.parts: list[str] = []  # the answer's text as generated
        self.shown: list[str] = []  # the message's text
        self.calls = CallStream(tools) if (tools := response_tools(req)) else None
        self.message_index: int | None = None
        self.items: list[FunctionCallItem] = []  # the call items, done

    def _event(self, kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        out = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return kind, out

    def _response(self, status: ItemStatus, output: list[OutputMessage | FunctionCallItem],
                  use: ResponseUsage | None, completed_at: int | None = None
                  ) -> dict[str, Any]:
        return response_object(self.req, rid=self.id, created_at=self.created_at,
                               status=status, output=output, use=use,
                               completed_at=completed_at).body()

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.message_id, "output_index": self.message_index,
                "content_index": 0}

    def _outputs(self) -> int:
        return len(self.items) + (self.message_index is not None)

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        started = self._response(IN_PROGRESS, [], None)
        out = [self._event("response.created", response=started),
               self._event("response.in_progress", response=started)]
        if self.calls is None:
            out += self._open_message()
        return out

    def _open_message(self) -> list[tuple[str, dict[str, Any]]]:
        self.message_index = self._outputs()
        return [self._event("response.output_item.added", output_index=self.message_index,
                            item=output_message(self.message_id, None, IN_PROGRESS).body()),
                self._event("response.content_part.added", **self._at(),
                            part=OutputText(text="").body())]

    def delta(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        self.parts.append(text)
        if self.calls is None:
            return self._text(text)
        return self._pieces(self.calls.feed(text))

    def _pieces(self, pieces: list[str | Call]) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for piece in pieces:
            out += self._text(piece) if isinstance(piece, str) else self._call(piece)
        return out

    def _text(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        out = self._open_message() if self.message_index is None else []
        self.shown.append(text)
        return [*out, self._event("response.output_text.delta", **self._at(), delta=text,
                                  logprobs=[])]

    def _call(self, call: Call) -> list[tuple[str, dict[str, Any]]]:
        index, item_id = self._outputs(), call_item_id()
        at = {"item_id": item_id, "output_index": index}
        done = function_call(call, item_id, COMPLETED)
        self.items.append(done)
        return [self._event("response.output_item.added", output_index=index,
                            item=function_call(call, item_id, IN_PROGRESS).body()),
                self._event("response.function_call_arguments.delta", **at,
                            delta=call.arguments),
                self._event("response.function_call_arguments.done", **at,
                            arguments=call.arguments),
                self._event("response.output_item.done", output_index=index,
                            item=done.body())]

    def text(self) -> str:
        return "".join(self.parts)

    def finish(self, finish_reason: str, prompt_tokens: int, completion_tokens: int
               ) -> list[tuple[str, dict[str, Any]]]:
        status = status_of(finish_reason)
        out = self._pieces(self.calls.finish()) if self.calls is not None else []
        if self.message_index is None and not self.items:
            out += self._open_message()  # an empty answer is an empty message
        output: list[OutputMessage | FunctionCallItem] = list(self.items)
        if self.message_index is not None:
            text = "".join(self.shown)
            item = output_message(self.message_id, text, status)
            output.insert(self.message_index, item)
            out += [self._event("response.output_text.done", **self._at(), text=text,
                                logprobs=[]),
                    self._event("response.content_part.done", **self._at(),
                                part=OutputText(text=text).body()),
                    self._event("response.output_item.done",
                                output_index=self.message_index, item=item.body())]
        done = self._response(status, output, ResponseUsage.of(prompt_tokens, completion_tokens),
                              int(time.time()))
        return [*out, self._event(f"response.{status}", response=done)]

    def error(self, err: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """An error after the stream began (an OpenAI error object's fields)."""
        return self._event("error", code=err.get("code"), message=str(err.get("message")),
                           param=err.get("param"))
