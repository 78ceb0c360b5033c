"""A request's tools as they are used (``Tools``; ``tools_of`` reads them from a chat
body): what the chat template renders, and the grammar that makes a required call
certain.

``tool_choice``:

- ``auto`` (the default when there are tools): the model writes text or calls, read
  back (jobs.protocol.tool_calls);
- ``required``, or a named function: the answer is constrained (llguidance, the same
  library and masks as structured outputs) to calls only, ``<tool_call>`` and a JSON
  object whose ``name`` is one of the functions (the named one) and whose ``arguments``
  validate against that function's ``parameters``; one call with
  ``parallel_tool_calls: false``, one or more otherwise;
- ``none``: the tools are not given to the template and nothing is read back: the
  answer is text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from jobs.protocol.structured import Constraint

OPEN, CLOSE = "<tool_call>", "</tool_call>"
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
# A required call's JSON as ``json.dumps`` writes it: no space to wander in.
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Function:
    name: str
    description: str | None
    parameters: dict[str, Any] | None


@dataclass(frozen=True)
class Tools:
    """A request's tools as they are used: ``choice`` is ``auto``, ``required`` or the
    name of the function to call (``none`` is no Tools at all)."""

    functions: tuple[Function, ...]
    choice: str = "auto"
    parallel: bool = True

    def template(self) -> list[dict[str, Any]]:
        """The ``tools`` the chat template renders."""
        out = []
        for f in self.functions:
            fn: dict[str, Any] = {"name": f.name}
            if f.description is not None:
                fn["description"] = f.description
            fn["parameters"] = f.parameters if f.parameters is not None else NO_PARAMETERS
            out.append({"type": "function", "function": fn})
        return out

    def forced(self) -> bool:
        return self.choice != "auto"

    def callable(self) -> tuple[Function, ...]:
        if self.choice in ("auto", "required"):
            return self.functions
        return tuple(f for f in self.functions if f.name == self.choice)

    def grammar(self) -> str:
        """The Lark grammar (llguidance's, ``%json`` schemas inside) of an answer that is
        calls only: one, or one or more when calls may be parallel."""
        bodies = []
        for i, f in enumerate(self.callable()):
            schema = {"type": "object",
                      "properties": {"name": {"const": f.name},
                                     "arguments": f.parameters if f.parameters is not None
                                     else {"type": "object"}},
                      "required": ["name", "arguments"], "additionalProperties": False,
                      "x-guidance": COMPACT}
            bodies.append(f"fn{i}: %json {orjson.dumps(schema).decode()}")
        alternatives = " | ".join(f"fn{i}" for i in range(len(bodies)))
        head = "start: call (\"\\n\" call)*" if self.parallel else "start: call"
        return "\n".join([head, f"call: \"{OPEN}\" body \"{CLOSE}\"",
                          f"body: {alternatives}", *bodies]) + "\n"

    def constraint(self) -> Constraint | None:
        """What the engines enforce: calls only when a call is required."""
        if not self.forced():
            return None
        return Constraint({}, lark=self.grammar())

    def names(self) -> set[str]:
        return {f.name for f in self.callable()}


def tools_of(body: dict[str, Any]) -> Tools | None:
    """The tools of a valid chat body (a dict as sent on: ``tools``, ``tool_choice``,
    ``parallel_tool_calls``); None when there are none or ``tool_choice`` is ``none``."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    functions = tuple(Function(t["function"]["name"], t["function"].get("description"),
                               t["function"].get("parameters")) for t in tools)
    if isinstance(choice, dict):
        picked = str(choice["function"]["name"])
    else:
        picked = str(choice or "auto")
    return Tools(functions, picked, body.get("parallel_tool_calls") is not False)
