"""What inferq does with each request parameter: one table, ``PARAMETERS`` (by
endpoint: every parameter of the pinned openai SDK's create method), with the tables of
the objects inside a body (messages and their parts, tools, ``stream_options``, the
Responses API's input items, ``text``). A parameter is implemented (a field of the
endpoint's model), taken only at the value that does nothing (``DEFAULT_ONLY``: left
out of the body the model reads), or refused; ``jobs.protocol.parsing.supported``
judges a body by it. docs/API.md's table is ``parameter_table()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from jobs.protocol.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES
from jobs.protocol.generation import MAX_STOP

IMPLEMENTED, DEFAULT_ONLY, REFUSED = "implemented", "default only", "refused"


@dataclass(frozen=True)
class Param:
    """What inferq does with one parameter. ``noop``: the values besides null a
    DEFAULT_ONLY parameter is taken at, each the answer without it (JSON-typed: ``0.0``
    is any number 0, ``1`` the integer 1, ``False`` the boolean)."""

    status: str
    note: str
    noop: tuple[Any, ...] = ()


def _impl(note: str) -> Param:
    return Param(IMPLEMENTED, note)


def _only(note: str, *noop: Any) -> Param:
    return Param(DEFAULT_ONLY, note, noop)


def _refused(note: str) -> Param:
    return Param(REFUSED, note)


PENALTIES = ("-2 to 2, OpenAI's formula: each token's logit less `presence_penalty` if the "
             "choice generated it so far and `frequency_penalty` times the times it did")
LOGIT_BIAS = ("up to 300 token ids of the model's tokenizer (strings) to -100..100, added to "
              "their logits before sampling; an id the model does not have is a 400")
N = ("1 to 128 choices, each its own sequence (`index`; with `seed`, choice i is seeded "
     "seed + i); usage counts every choice's tokens, the prompt once")
FUNCTIONS = "the deprecated functions are not implemented: use `tools` (see Tool calls)"
TOOLS_DOC = "see Tool calls"
TOOL_CHOICE = ("`none` (tools not given to the model, no calls), `auto` (the default with "
               "tools), `required`, or `{\"type\": \"function\", \"function\": {\"name\"}}`; "
               "`required` and a named function are enforced token by token (see Tool calls)")
PARALLEL = ("`true` (the default): one or more calls; `false`: at most one (see Tool calls)")
LOGPROBS = "log probabilities are not implemented"
PROMPT_CACHE = "no client-directed prompt cache (the workers' prefix cache needs no hints)"
USER = ("checked (at most 256 characters), else unused: it changes no answer (a job or a "
        "batch keeps it only as part of the request's stored body)")
MAX_TOKENS = "the completion's token limit, within the context; none: the rest of the context"
SHARED: dict[str, Param] = {
    "max_tokens": _impl(MAX_TOKENS),
    "seed": _impl("seeds this request's own sampler (a signed 64-bit integer); best effort, "
                  "as at OpenAI"),
    "stop": _impl(f"up to {MAX_STOP} non-empty strings; the text ends before the first"),
    "stream": _impl("server-sent events (see Chat completions / completions)"),
    "stream_options": _impl("see `stream_options` below"),
    "temperature": _impl("0 to 2; 0 is greedy"),
    "top_p": _impl("nucleus sampling, above 0 to 1"),
    "user": _impl(USER),
    "frequency_penalty": _impl(PENALTIES),
    "presence_penalty": _impl(PENALTIES),
    "logit_bias": _impl(LOGIT_BIAS),
    "n": _impl(N),
}
# Every parameter of the pinned SDK's chat.completions.create, completions.create and
# embeddings.create, in the SDK's order (docs/API.md's table; tests/unit/test_parameters.py
# keeps the three equal).
PARAMETERS: dict[str, dict[str, Param]] = {
    CHAT: {
        "messages": _impl("roles `system`, `developer`, `user`, `assistant`, `tool`; text "
                          "only (see `messages` below)"),
        "model": _impl("a registered chat model (`GET /v1/models`)"),
        "audio": _refused("audio output is not implemented"),
        "frequency_penalty": SHARED["frequency_penalty"],
        "function_call": _only(FUNCTIONS, "none"),
        "functions": _refused(FUNCTIONS),
        "logit_bias": SHARED["logit_bias"],
        "logprobs": _impl("each choice's tokens with their log probabilities (see Log "
                          "probabilities), streamed too"),
        "max_completion_tokens": _impl(MAX_TOKENS + "; wins over `max_tokens`"),
        "max_tokens": SHARED["max_tokens"],
        "metadata": _only("completions are not stored: there is nothing to attach it to", {}),
        "modalities": _only("text output only", ["text"]),
        "moderation": _refused("moderation is not implemented"),
        "n": SHARED["n"],
        "parallel_tool_calls": _impl(PARALLEL),
        "prediction": _refused("predicted outputs are not implemented"),
        "presence_penalty": SHARED["presence_penalty"],
        "prompt_cache_key": _refused(PROMPT_CACHE),
        "prompt_cache_options": _refused(PROMPT_CACHE),
        "prompt_cache_retention": _refused(PROMPT_CACHE),
        "reasoning_effort": _refused("the served models do not reason"),
        "response_format": _impl("`text`; `json_object` (JSON mode: one JSON object); "
                                 "`json_schema` (structured outputs: JSON valid for its "
                                 "`schema`, enforced token by token; a schema that cannot "
                                 "be enforced is a 400 saying why). See Structured outputs"),
        "safety_identifier": _refused("inferq does no abuse monitoring by end user"),
        "seed": SHARED["seed"],
        "service_tier": _only("a realtime request runs in the default tier (flex is a batch "
                              "option)", "auto", "default"),
        "stop": SHARED["stop"],
        "store": _only("completions are not stored", False),
        "stream": SHARED["stream"],
        "stream_options": SHARED["stream_options"],
        "temperature": SHARED["temperature"],
        "tool_choice": _impl(TOOL_CHOICE),
        "tools": _impl("function tools (see `tools[]` below), on a model whose chat template "
                       "renders tools; other tool types are refused"),
        "top_logprobs": _impl("0 to 20 most likely tokens at each position; needs "
                              "`logprobs: true`"),
        "top_p": SHARED["top_p"],
        "user": SHARED["user"],
        "verbosity": _refused("verbosity control is not implemented"),
        "web_search_options": _refused("web search is not implemented"),
    },
    COMPLETIONS: {
        "model": _impl("a registered chat model (`GET /v1/models`)"),
        "prompt": _impl("one prompt: a string, or a list of one string (no token-id prompts)"),
        "best_of": _impl("1 to 20, at least `n`: that many sequences, the `n` with the "
                         "highest mean log probability per token returned; not with `stream`"),
        "echo": _impl("the prompt before each choice's text (with `logprobs`, its tokens "
                      "too, the first one's log probability null)"),
        "frequency_penalty": SHARED["frequency_penalty"],
        "logit_bias": SHARED["logit_bias"],
        "logprobs": _impl("0 to 5: each token's log probability and the `logprobs` most "
                          "likely tokens at its position (see Log probabilities)"),
        "max_tokens": SHARED["max_tokens"],
        "n": SHARED["n"],
        "presence_penalty": SHARED["presence_penalty"],
        "seed": SHARED["seed"],
        "stop": SHARED["stop"],
        "stream": SHARED["stream"],
        "stream_options": SHARED["stream_options"],
        "suffix": _refused("insertion (text after the completion) is not implemented"),
        "temperature": SHARED["temperature"],
        "top_p": SHARED["top_p"],
        "user": SHARED["user"],
    },
    EMBEDDINGS: {
        "input": _impl("a string, strings, token ids or lists of token ids; none longer than "
                       "the model's context"),
        "model": _impl("a registered embeddings model (`GET /v1/models`)"),
        "dimensions": _impl("the first `dimensions` values, renormalized; at most the "
                            "model's size; only for a model trained for shortened vectors "
                            "(`matryoshka` in `GET /v1/models`), else 400"),
        "encoding_format": _impl("`float` or `base64` (little-endian float32)"),
        "user": SHARED["user"],
    },
}
# The fields of a message, by role (the SDK's message types); ``function`` messages are
# refused whole.
MESSAGE_FIELDS: dict[str, Param] = {
    "role": _impl("`system`, `developer` (read as `system`), `user`, `assistant`, `tool` (a "
                  "call's result, on a model whose chat template renders tools); `function` "
                  "is refused (" + FUNCTIONS + ")"),
    "content": _impl("a string, or `text` parts (joined); other part types are refused: the "
                     "models read text only"),
    "name": _impl("checked (at most 256 characters); the chat template does not use it"),
    "audio": _refused("audio is not implemented"),
    "function_call": _refused(FUNCTIONS),
    "refusal": _refused("refusals are not implemented"),
    "tool_calls": _impl("an assistant message's function calls (`{id, type: \"function\", "
                        "function: {name, arguments}}`), rendered by the chat template"),
    "tool_call_id": _impl("a tool message's: the id of the call it answers"),
}
ROLE_FIELDS: dict[str, tuple[str, ...]] = {
    "system": ("content", "role", "name"), "developer": ("content", "role", "name"),
    "user": ("content", "role", "name"),
    "assistant": ("role", "audio", "content", "function_call", "name", "refusal",
                  "tool_calls"),
    "tool": ("content", "role", "tool_call_id"),
}
REFUSED_ROLES = ("function",)
# A function tool of ``tools`` and its ``function``.
TOOL_FIELDS: dict[str, Param] = {
    "type": _impl("`function`; other tool types (`custom`) are refused"),
    "function": _impl("see `tools[].function`"),
}
FUNCTION_FIELDS: dict[str, Param] = {
    "name": _impl("letters, digits, `_` and `-`, at most 64 characters; unique in `tools`"),
    "description": _impl("given to the chat template"),
    "parameters": _impl("a JSON schema (none: no parameters); a required call's arguments "
                        "are valid for it, and a schema that cannot be enforced is a 400"),
    "strict": _impl("accepted; a required call's arguments follow the schema whatever it "
                    "says, and `auto` calls are not checked against it"),
}
TEXT_PART_FIELDS: dict[str, Param] = {
    "text": _impl("the text"),
    "type": _impl("`text` only"),
    "prompt_cache_breakpoint": _refused(PROMPT_CACHE),
}
STREAM_OPTIONS: dict[str, Param] = {
    "include_obfuscation": _only("stream chunks are not obfuscated", False),
    "include_usage": _impl("one more chunk with `usage`, before `[DONE]`"),
}
# responses.create (/v1/responses), and the objects inside its body.
STORE = ("responses are not stored (inferq keeps nothing it could return later): store "
         "absent is false here, where OpenAI's default is true")
NO_LOGPROBS = "/v1/responses returns no log probabilities"
NOT_STORED = ("responses are not stored: send the earlier turns in `input` (an answer's "
              "output message is an input item)")
PARAMETERS[RESPONSES] = {
    "access_programs": _refused("OpenAI's access programs do not exist here"),
    "background": _only("background responses are not implemented: POST /v1/jobs with "
                        "endpoint /v1/responses runs one asynchronously", False),
    "background_options": _refused("background responses are not implemented"),
    "context_management": _refused("context management (compaction) is not implemented"),
    "conversation": _refused("conversations are not stored"),
    "image": _refused("image input is not implemented"),
    "include": _only("nothing more can be included: no log probabilities, reasoning or tool "
                     "outputs", []),
    "input": _impl("a string (one user message), or message items (see `input[]` below)"),
    "instructions": _impl("a system message before the input"),
    "max_output_tokens": _impl(MAX_TOKENS + "; reached: `status: incomplete`"),
    "max_tool_calls": _refused("a limit on calls is not implemented (`parallel_tool_calls: "
                               "false` asks for at most one)"),
    "metadata": _impl("at most 16 pairs (keys up to 64, values up to 512 characters); "
                      "echoed in the response object"),
    "model": _impl("a registered chat model (`GET /v1/models`)"),
    "moderation": _refused("moderation is not implemented"),
    "parallel_tool_calls": _impl(PARALLEL),
    "previous_response_id": _refused(NOT_STORED),
    "prompt": _refused("stored prompt templates are not implemented"),
    "prompt_cache_key": _refused(PROMPT_CACHE),
    "prompt_cache_options": _refused(PROMPT_CACHE),
    "prompt_cache_retention": _refused(PROMPT_CACHE),
    "reasoning": _refused("the served models do not reason"),
    "safety_identifier": _refused("inferq does no abuse monitoring by end user"),
    "service_tier": _only("a realtime request runs in the default tier (flex is a batch "
                          "option)", "auto", "default"),
    "store": _only(STORE, False),
    "stream": _impl("server-sent events of the Responses API (see Responses)"),
    "stream_options": _impl("see `stream_options (responses.create)` below"),
    "temperature": SHARED["temperature"],
    "text": _impl("see `text` below: plain text only"),
    "tool_choice": _impl("`none`, `auto` (the default with tools), `required`, or "
                         "`{\"type\": \"function\", \"name\"}`: as chat's (see Tool calls)"),
    "tools": _impl("function tools (see `tools[] (responses.create)` below), on a model "
                   "whose chat template renders tools; other tool types are refused"),
    "top_logprobs": _refused(NO_LOGPROBS),
    "top_p": SHARED["top_p"],
    "truncation": _only("input is never truncated: a prompt over the context is 400 "
                        "`context_length_exceeded`", "disabled"),
    "user": SHARED["user"],
}
# The fields of an input message item, by role: the SDK's easy input message, input
# message and (for assistant) output message types together.
INPUT_ITEM_FIELDS: dict[str, Param] = {
    "type": _impl("`message` (the default); `function_call` and `function_call_output` "
                  "items are below; other item types (reasoning, item references, other "
                  "tools' calls) are refused"),
    "role": _impl("`system`, `developer` (read as `system`), `user`, `assistant`"),
    "content": _impl("a string, or text parts (joined; see `input[].content[]`)"),
    "id": _impl("an earlier output message's: checked (at most 256 characters), else unused"),
    "status": _impl("an earlier output message's: checked, else unused"),
    "phase": _refused("phases are not implemented: the served models write final answers "
                      "only"),
}
ITEM_ROLE_FIELDS: dict[str, tuple[str, ...]] = {
    **{role: ("content", "role", "phase", "status", "type")
       for role in ("system", "developer", "user")},
    "assistant": ("id", "content", "role", "status", "type", "phase"),
}
INPUT_PART_FIELDS: dict[str, Param] = {
    "text": _impl("the text"),
    "type": _impl("`input_text`, or `output_text` (an earlier answer's); other part types "
                  "(`input_image`, `input_file`, `refusal`) are refused: the models read "
                  "text only"),
    "annotations": _only("annotations are not implemented", []),
    "logprobs": _only(NO_LOGPROBS, []),
    "prompt_cache_breakpoint": _refused(PROMPT_CACHE),
}
PART_TYPE_FIELDS: dict[str, tuple[str, ...]] = {
    "input_text": ("text", "type", "prompt_cache_breakpoint"),
    "output_text": ("annotations", "text", "type", "logprobs"),
}
TEXT_CONFIG: dict[str, Param] = {
    "format": _impl("`text`; `json_object`; `json_schema` (`name`, `schema`, `strict`, "
                    "`description`): structured outputs as chat's `response_format` (see "
                    "Structured outputs)"),
    "verbosity": _refused("verbosity control is not implemented"),
}
RESPONSES_TOOL_FIELDS: dict[str, Param] = {
    "type": _impl("`function`; other tool types (web search, file search, MCP, custom, …) "
                  "are refused"),
    "name": FUNCTION_FIELDS["name"],
    "description": FUNCTION_FIELDS["description"],
    "parameters": FUNCTION_FIELDS["parameters"],
    "strict": FUNCTION_FIELDS["strict"],
    "allowed_callers": _refused("programmatic tool calling is not implemented"),
    "async": _only("calls are answered in the next request's input", False),
    "defer_loading": _only("tool search is not implemented: every tool is given to the "
                           "model", False),
    "output_schema": _refused("output schemas are not implemented"),
}
CALL_STATUS = "an earlier answer's: checked, else unused"
FUNCTION_CALL_FIELDS: dict[str, Param] = {
    "type": _impl("`function_call`: an earlier answer's call (an assistant message's "
                  "`tool_calls` to the chat template)"),
    "call_id": _impl("the call's id"),
    "name": _impl("the function called"),
    "arguments": _impl("its arguments (JSON text)"),
    "id": _impl("an earlier output item's: checked (at most 256 characters), else unused"),
    "status": _impl(CALL_STATUS),
    "caller": _refused("programmatic tool calling is not implemented"),
    "namespace": _refused("tool namespaces are not implemented"),
    "async": _only("calls are answered in the next request's input", False),
}
FUNCTION_CALL_OUTPUT_FIELDS: dict[str, Param] = {
    "type": _impl("`function_call_output`: a call's result (a `tool` message to the chat "
                  "template)"),
    "call_id": _impl("the id of the call it answers"),
    "output": _impl("a string, or `input_text` parts (joined)"),
    "id": _impl("checked (at most 256 characters), else unused"),
    "status": _impl(CALL_STATUS),
    "caller": _refused("programmatic tool calling is not implemented"),
    "name": _refused("the output is matched to its call by `call_id`"),
    "namespace": _refused("tool namespaces are not implemented"),
}
RESPONSE_STREAM_OPTIONS: dict[str, Param] = {
    "include_obfuscation": _only("stream events are not obfuscated", False),
}
ITEM_TYPE_FIELDS = {"function_call": FUNCTION_CALL_FIELDS,
                    "function_call_output": FUNCTION_CALL_OUTPUT_FIELDS}


def noop_json(v: Any) -> str:
    """A no-op value as a client writes it (``0``, not ``0.0``)."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return orjson.dumps(v).decode()


# The SDK method each endpoint's table is of, as docs/API.md names it.
METHODS = {CHAT: "chat.completions.create", COMPLETIONS: "completions.create",
           EMBEDDINGS: "embeddings.create", RESPONSES: "responses.create"}
NESTED = {"messages[]": MESSAGE_FIELDS, "messages[].content[]": TEXT_PART_FIELDS,
          "stream_options": STREAM_OPTIONS, "tools[]": TOOL_FIELDS,
          "tools[].function": FUNCTION_FIELDS,
          "input[]": INPUT_ITEM_FIELDS, "input[].content[]": INPUT_PART_FIELDS,
          "input[] (function_call)": FUNCTION_CALL_FIELDS,
          "input[] (function_call_output)": FUNCTION_CALL_OUTPUT_FIELDS,
          "tools[] (responses.create)": RESPONSES_TOOL_FIELDS,
          "text": TEXT_CONFIG, "stream_options (responses.create)": RESPONSE_STREAM_OPTIONS}


def parameter_table() -> str:
    """docs/API.md's tables of the parameters, as Markdown (its test compares them)."""
    def row(*cells: str) -> str:
        return "| " + " | ".join(cells) + " |"

    def accepted(p: Param) -> str:
        if p.status == IMPLEMENTED:
            return "any valid value"
        return ", ".join(f"`{noop_json(v)}`" for v in (*p.noop, None))

    lines = [row("method", "parameter", "status", "accepted", "note"), row(*["---"] * 5)]
    for endpoint, table in PARAMETERS.items():
        lines += [row(f"`{METHODS[endpoint]}`", f"`{name}`", p.status, accepted(p), p.note)
                  for name, p in table.items()]
    lines += ["", row("object", "field", "status", "accepted", "note"), row(*["---"] * 5)]
    for obj, table in NESTED.items():
        lines += [row(f"`{obj}`", f"`{name}`", p.status, accepted(p), p.note)
                  for name, p in table.items()]
    return "\n".join(lines) + "\n"
