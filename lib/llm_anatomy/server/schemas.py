"""The OpenAI API's shapes: what a client sends, what it gets back (whole, or as chunks of a stream), and its errors.

A request is read in three steps, each of which can refuse it before the engine sees it: the body is JSON
(`parse_json`), its fields are the API's, of the right kinds and in range (`ChatRequest`, `CompletionRequest`: an
unknown field is refused, as OpenAI refuses it), and then the server checks what only it knows (the model's name, the
prompt's length against the context). A refusal is an `APIError`, whose body is the API's own:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

A stream is server-sent events (the HTML standard's text/event-stream): each chunk is one event, the line
`data: <the chunk as JSON>` and then an empty line; the last event is `data: [DONE]`. `sse` frames one.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DONE = b"data: [DONE]\n\n"  # the stream's last event: no more chunks


class APIError(Exception):
    """A refusal with the API's error body: status 400 (bad request), 401, 404, 413, 429 (with Retry-After), 503."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


Probability = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class _Strict(BaseModel):
    # strict: "0.5" is not a number and true is not 1; forbid: a field the API does not have is refused
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False  # OpenAI's rule: usage is streamed only when asked for, in a last chunk of its own


class _Sampling(_Strict):
    """The fields both endpoints share: how many tokens, how to choose them, where to stop."""

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    top_k: int | None = None  # not OpenAI's, but vLLM's and transformers': None, 0 or -1 = no top-k
    min_p: Probability = 0.0
    repetition_penalty: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0  # vLLM's, not OpenAI's; 1 is off
    presence_penalty: Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)] = 0.0  # generate/penalties.py
    frequency_penalty: Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)] = 0.0
    stop: str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=4)] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1  # one answer per request here
    user: str | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.top_k is not None and self.top_k < -1:
            raise ValueError("top_k must be at least 1 (or 0 or -1 for no top-k)")
        if self.stop == "":
            raise ValueError("stop must be a non-empty string or a list of up to 4 of them")
        return self

    def stops(self) -> list[str]:
        return [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)


class JSONSchemaFormat(_Strict):
    """response_format's json_schema: a name, the schema (the course's subset: constrained/schema.py), strict."""

    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    schema_: dict = Field(alias="schema")  # "schema" is a name pydantic's BaseModel keeps for itself
    strict: bool | None = None  # every answer follows the schema here, strict or not: the mask allows nothing else


class ResponseFormat(_Strict):
    """The chat API's response_format: "text" (no constraint), "json_object" (any JSON object), or "json_schema"."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is needed with type 'json_schema', and only with it")
        return self


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None  # the answer constrained to JSON (server/structured.py)

    @model_validator(mode="after")
    def _logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self


class CompletionRequest(_Sampling):
    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None  # the legacy API: how many alternatives per token
    echo: Literal[False] = False


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or APIError 400 (NaN and Infinity, which Python's json writes, are refused here)."""
    def no_constants(name):
        raise ValueError(f"{name} is not a number in JSON")

    try:
        body = json.loads(raw, parse_constant=no_constants)
    except (ValueError, UnicodeDecodeError) as err:
        raise APIError(400, f"We could not parse the JSON body of your request ({err}). The body must be one JSON "
                            "object.") from None
    if not isinstance(body, dict):
        raise APIError(400, f"The body must be a JSON object, not a JSON {type(body).__name__}.")
    return body


def parse_request(body: dict, kind: type[_Sampling]) -> _Sampling:
    """The request's fields checked against the API's (ChatRequest or CompletionRequest), or APIError 400 naming the
    first field that is wrong."""
    try:
        return kind.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        param = _param(first["loc"])
        if first["type"] == "extra_forbidden":
            raise APIError(400, f"Unrecognized request argument supplied: {param}", param=param) from None
        if first["type"] == "missing":
            raise APIError(400, f"Missing required parameter: '{param}'.", param=param) from None
        value = first.get("input")
        shown = "NaN" if isinstance(value, float) and math.isnan(value) else repr(value)[:80]
        raise APIError(400, f"Invalid value for '{param}': {first['msg']} (got {shown}).", param=param) from None


def _param(loc: tuple) -> str | None:
    """The field an error is about, as the API names it ("messages.0.role"), without pydantic's union tags ("str")."""
    names = [str(p) for p in loc if isinstance(p, int) or (re.fullmatch(r"[a-z_]+", p) and p not in _TAGS)]
    return ".".join(names) or None


_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def sse(payload: dict) -> bytes:
    """One server-sent event: `data: ` and the payload as one line of JSON, then the empty line that ends the event."""
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


# ---------------------------------------------------------------------------------------------- what comes back

def logprob_entry(text: str, logprob: float, top: list[tuple[str, float]]) -> dict:
    """One token's logprob the way the chat API gives it (text, natural log, UTF-8 bytes, the top alternatives)."""
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in top]}


def logprob_entries(raw: list[tuple], decode) -> list[dict]:
    """The API's entries for the engine's raw logprobs: (token id, logprob, [(id, logprob), ...]) per token, each
    token's text decoded on its own (`decode`: the tokenizer's), as the chat API shows it."""
    return [logprob_entry(decode([token]), logprob, [(decode([t]), lp) for t, lp in top]) for token, logprob, top in raw]


def legacy_logprobs(entries: list[dict] | None, offset: int = 0) -> dict | None:
    """The completions API's older shape of the same entries: tokens, token_logprobs, top_logprobs, text_offset."""
    if entries is None:
        return None
    offsets, at = [], offset
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class Reply:
    """One answer as the API writes it: `kind` "chat" (objects chat.completion and chat.completion.chunk) or "text"
    (text_completion, the older API, whose whole answer is one chunk with all the text). Every chunk of an answer
    shares its id, creation time and model. logprobs: entries from logprob_entry, or None when none were asked for."""

    def __init__(self, rid: str, created: int, model: str, kind: str):
        self.id, self.created, self.model, self.kind = rid, created, model, kind
        self.offset = 0  # characters streamed so far (the legacy logprobs' text_offset)
        self.usage_asked = False  # stream_options.include_usage: every chunk says "usage": null, the last has it

    def chunk(self, text: str | dict, finish: str | None = None, logprobs=None, usage_: dict | None = None) -> dict:
        """One chunk of a stream: its text (chat: or a whole delta, such as the first one's role), or its end."""
        if self.kind == "chat":
            delta = {"content": text} if isinstance(text, str) else text
            return self._body("chat.completion.chunk", {"delta": delta}, finish, logprobs, usage_)
        chunk = self._body("text_completion", {"text": text}, finish, logprobs, usage_)
        self.offset += len(text)
        return chunk

    def usage_chunk(self, usage_: dict) -> dict:
        """The stream's last chunk when the client asked for usage: no choices, only the counts (as OpenAI sends)."""
        kind = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [],
                "usage": usage_}

    def whole(self, text: str, finish: str, logprobs, usage_: dict) -> dict:
        """The whole answer, not streamed."""
        if self.kind == "chat":
            message = {"message": {"role": "assistant", "content": text}}
            return self._body("chat.completion", message, finish, logprobs, usage_)
        return self._body("text_completion", {"text": text}, finish, logprobs, usage_)

    def _body(self, kind: str, content: dict, finish, logprobs, usage_) -> dict:
        if logprobs is not None:  # chat: {"content": [entries]}; the completions API: its older shape
            logprobs = {"content": logprobs, "refusal": None} if self.kind == "chat" else \
                legacy_logprobs(logprobs, self.offset)
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [{"index": 0, **content, "logprobs": logprobs, "finish_reason": finish}]}
        if usage_ is not None or self.usage_asked:
            body["usage"] = usage_
        return body
