"""The OpenAI API's request and response bodies (pydantic models), with vLLM's extensions.

Field names are OpenAI's (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``,
the error object) and, for sampling options OpenAI lacks, vLLM's (``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``ignore_eos``, ``stop_token_ids``; the choice's
``stop_reason``). Sources: the OpenAI API reference and vLLM's
``vllm/entrypoints/openai/protocol.py`` (read, not copied).

Unknown request fields are accepted and ignored (as vLLM does); a known field of the wrong
type is a 400 naming it (:mod:`trtcore.serve.app`). OpenAI fields that would change the
answer and that this server does not implement are refused (400 naming the field), never
ignored: ``logit_bias``, ``response_format`` other than ``text``, ``best_of`` above 1,
``tools`` / ``tool_choice`` (function calling); so is ``top_logprobs`` without
``logprobs: true``, as OpenAI does. ``logprobs`` (completions) and ``top_logprobs`` (chat)
above :data:`MAX_LOGPROBS` (20, vLLM's ``max_logprobs``) are a 400 naming the field and the
limit, whatever the backend. vLLM's extra fields this server does not implement
(:data:`UNSUPPORTED_EXTRAS`, :data:`UNSUPPORTED_CHAT_EXTRAS`: guided decoding, beam search,
prompt logprobs, ...) are refused the same way unless they hold their neutral value. Types are
strict, as OpenAI's API: ``"yes"`` is no boolean and ``"2"`` or ``2.0`` no integer (an integer
is a number, though); ``null`` for a field with a default is that default.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ..runtime.sampling import SamplingParams

__all__ = [
    "ChatChoice",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatLogprob",
    "ChatLogprobs",
    "ChatResponseMessage",
    "ChatStreamChoice",
    "ChatMessage",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "CompletionResponse",
    "ErrorInfo",
    "ErrorResponse",
    "ModelCard",
    "MAX_LOGPROBS",
    "ModelList",
    "StreamOptions",
    "TopLogprob",
    "UsageInfo",
    "random_id",
]


#: the most top log-probabilities per token a request may ask for (vLLM's ``max_logprobs``,
#: the GPU sampler kernel's ``max_logprobs``): the same limit on every backend
MAX_LOGPROBS = 20
#: most ``stop`` strings (and ``stop_token_ids``) a request may give, and most characters in
#: all: every step of the engine matches each running request's stops, so one request's
#: thousands would slow every other request's stream (OpenAI takes 4; vLLM sets no bound)
MAX_STOP_STRINGS = 1024
MAX_STOP_CHARS = 65536


def _logprobs_limit(name: str, v: int | None) -> int | None:
    if v is not None and v > MAX_LOGPROBS:
        raise ValueError(f"{name}={v} is above this server's limit of {MAX_LOGPROBS} (max_logprobs)")
    return v


def random_id(prefix: str) -> str:
    """A response id such as ``cmpl-<32 hex digits>`` (OpenAI's shape)."""
    return f"{prefix}-{uuid.uuid4().hex}"


class _Body(BaseModel):
    """Request bodies: unknown fields are ignored, known ones are strictly typed; ``null`` for
    a field that has a default means that default (OpenAI's schema marks them nullable, and
    clients that send every field send ``"n": null``, ``"stream": null``)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            fields = cls.model_fields
            return {k: v for k, v in data.items() if v is not None or k not in fields or fields[k].is_required() or fields[k].default is None}
        return data


#: vLLM's request fields that would change the answer, which this server does not implement,
#: and their neutral values (accepted): any other value is a 400 naming the field, never
#: ignored. Both endpoints.
UNSUPPORTED_EXTRAS: dict[str, tuple[Any, ...]] = {
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None, []),
    "guided_grammar": (None,),
    "structured_outputs": (None, {}),
    "prompt_logprobs": (None,),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "truncate_prompt_tokens": (None,),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "logits_processors": (None, []),
    "return_tokens_as_token_ids": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
}
#: the same for chat only (OpenAI's legacy function calling; vLLM's template options)
UNSUPPORTED_CHAT_EXTRAS: dict[str, tuple[Any, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none"),
    "echo": (None, False),
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "documents": (None, []),
    "reasoning_effort": (None,),  # vLLM passes it to the chat template
}


def _refuse_extras(data: Any, table: dict[str, tuple[Any, ...]]) -> None:
    """Raise ValueError naming the first field of ``table`` whose value in ``data`` is not neutral."""
    if isinstance(data, dict):
        for name, neutral in table.items():
            if name in data and not any(data[name] == v and type(data[name]) is type(v) for v in neutral):
                raise _Refused(name, f"{name}={data[name]!r} is not supported by this server (it would change the answer); leave it out")


def _check_unicode(value: Any, path: list[str]) -> None:
    """Raise :class:`_Refused` naming the first string in ``value`` (a parsed JSON body) that is
    not valid Unicode (a lone surrogate), with its position."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            where = ".".join(path) or "body"
            raise _Refused(
                where, f"{where} holds a lone UTF-16 surrogate {value[exc.start]!r} at character {exc.start}; text must be valid Unicode"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key, path)
            _check_unicode(item, [*path, str(key)])
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_unicode(item, [*path, str(i)])


class _Refused(ValueError):
    """A refused extra field, with its name (the error's ``param``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class StreamOptions(_Body):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage`` (and
    ``"usage": null`` in the others)."""

    include_usage: bool = False
    continuous_usage_stats: bool = False

    @field_validator("continuous_usage_stats")
    @classmethod
    def _no_running_usage(cls, v: bool) -> bool:
        if v:  # vLLM's usage in every chunk: not implemented, and never ignored
            raise ValueError("continuous_usage_stats (usage in every chunk) is not supported by this server; use include_usage")
        return v


class _SamplingFields(_Body):
    """The sampling fields both endpoints share (OpenAI's names, vLLM's extensions)."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # vLLM's int64; a negative seed is taken mod 2**64
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, max_length=MAX_STOP_STRINGS)
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_bounded(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > MAX_STOP_STRINGS or sum(map(len, stops)) > MAX_STOP_CHARS:
            raise ValueError(
                f"{len(stops)} stop strings of {sum(map(len, stops))} characters in all; this server takes at most "
                f"{MAX_STOP_STRINGS} strings and {MAX_STOP_CHARS} characters (each is matched at every step)"
            )
        return v

    @field_validator("stream_options")
    @classmethod
    def _only_streamed(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if v is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed with stream: true")
        return v

    #: the extras this endpoint refuses unless neutral (the chat endpoint adds its own)
    refused_extras: ClassVar[dict[str, tuple[Any, ...]]] = UNSUPPORTED_EXTRAS

    @model_validator(mode="before")
    @classmethod
    def _no_unsupported_extras(cls, data: Any) -> Any:
        _refuse_extras(data, cls.refused_extras)
        return data

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        # JSON's "\ud800" escape gives a lone UTF-16 surrogate, which no tokenizer or UTF-8
        # response can take (it was a 500): refused here, naming where it is; the whole body
        # once (the nested models' own data is part of it)
        _check_unicode(data, [])
        return data

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v:
            raise ValueError("logit_bias is not supported by this server")
        return v

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "text") != "text":
            raise ValueError(f"response_format type {v.get('type')!r} is not supported by this server (guided decoding); only 'text'")
        return v

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """The engine's :class:`~trtcore.runtime.sampling.SamplingParams` of this body;
        unset fields take OpenAI's defaults (temperature 1, top_p 1).

        Raises:
            InvalidRequestError: a value SamplingParams refuses (the message names it).
        """
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            seed=None if self.seed is None else self.seed % (1 << 64),
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logprobs=logprobs,
        )


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a list of token ids, a list of
    strings or a list of token-id lists (OpenAI's four shapes; a list of K prompts is K
    requests, its choices carry the prompt's position as ``index``); an empty list, an empty
    token-id list or a list mixing the shapes is refused (400 naming ``prompt``).
    ``logprobs`` is the number of top log-probabilities per token (0 to
    :data:`MAX_LOGPROBS`); ``echo`` and ``suffix`` are not supported (400)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)
    add_special_tokens: bool = True  # vLLM's: what the tokenizer's post-processor adds (a BOS) to a text prompt

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_shape(cls, v: Any) -> Any:
        if not isinstance(v, list):
            return v
        if not v:
            raise ValueError("prompt is an empty list; give a string, token ids, or a list of those")
        kinds = {"list" if isinstance(x, list) else type(x).__name__ for x in v}
        if len(kinds) > 1:
            raise ValueError(f"prompt mixes {' and '.join(sorted(kinds))} items; give a list of strings, of token ids, or of token-id lists")
        for i, x in enumerate(v):
            if isinstance(x, list) and not x:
                raise ValueError(f"prompt[{i}] is empty; give at least one token id")
        return v

    @field_validator("logprobs")
    @classmethod
    def _logprobs_limit(cls, v: int | None) -> int | None:
        return _logprobs_limit("logprobs", v)

    @field_validator("best_of")
    @classmethod
    def _one_candidate(cls, v: int | None) -> int | None:
        if v is not None and v > 1:
            raise ValueError(f"best_of={v} is not supported by this server; only 1")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list (one item for a string or a single list of token ids)."""
        p = self.prompt
        if isinstance(p, str) or not isinstance(p[0], str | list):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(_Body):
    """One message: ``role`` and ``content`` (a string, or OpenAI's list of text parts).
    A part of another type (``image_url``, ``input_audio``, ``file``, ...) is refused (400
    naming it): the served model reads text only, and a part dropped silently would change
    the question."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("tool_calls")
    @classmethod
    def _arguments_as_objects(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        # OpenAI sends a call's "arguments" as a JSON string; chat templates read an object
        # (Qwen3-Coder's `arguments|items`, Qwen2.5's `arguments | tojson`): parsed, as vLLM's
        # chat_utils does; null or "" is {}
        if v is None:
            return v
        calls = []
        for i, call in enumerate(v):
            fn = call.get("function")
            if not isinstance(fn, dict):
                calls.append(call)
                continue
            args = fn.get("arguments")
            if isinstance(args, str) and args.strip():
                try:
                    args = json.loads(args)
                except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parser's depth
                    raise ValueError(f"tool_calls[{i}].function.arguments is not JSON ({exc}): {fn['arguments'][:80]!r}") from None
            elif not args:
                args = {}
            calls.append({**call, "function": {**fn, "arguments": args}})
        return calls

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, v: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        if isinstance(v, list):
            for i, part in enumerate(v):
                kind = part.get("type")
                if kind != "text":
                    raise ValueError(f"content part {i} has type {kind!r}; this server's model reads text parts only ('text')")
                if not isinstance(part.get("text"), str):
                    raise ValueError(f"content part {i} (type 'text') needs a string 'text', got {part.get('text')!r}")
        return v

    def text(self) -> str:
        """The content as one string: the ``text`` of each ``{"type": "text"}`` part, one part
        a line (joined with ``"\n"``, as vLLM's ``chat_utils`` and llama.cpp's server join them)."""
        if isinstance(self.content, list):
            return "\n".join(p["text"] for p in self.content)  # text parts only (the validator)
        return self.content or ""

    def template_message(self) -> dict[str, Any]:
        """The message as the chat template reads it: ``role`` and ``content`` (:meth:`text`),
        and ``name``, ``tool_calls`` (an assistant turn's calls) and ``tool_call_id`` (a tool
        turn's) where given, as vLLM passes them (``chat_utils``)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        out.update({k: v for k, v in (("name", self.name), ("tool_calls", self.tool_calls), ("tool_call_id", self.tool_call_id)) if v is not None})
        return out


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``: ``max_completion_tokens`` is OpenAI's newer name for
    ``max_tokens`` (it wins when both are set); ``logprobs`` (bool) with ``top_logprobs``
    (0 to :data:`MAX_LOGPROBS`); vLLM's ``add_generation_prompt`` (default true) and
    ``continue_final_message`` (the last message is continued: the prompt ends with its
    content, as transformers' ``continue_final_message``; needs ``add_generation_prompt``
    false). :data:`UNSUPPORTED_CHAT_EXTRAS` are refused unless neutral."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # vLLM's chat default: the rendered template writes its own BOS

    refused_extras: ClassVar[dict[str, tuple[Any, ...]]] = {**UNSUPPORTED_EXTRAS, **UNSUPPORTED_CHAT_EXTRAS}

    @field_validator("continue_final_message")
    @classmethod
    def _continue_without_generation_prompt(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("add_generation_prompt", True):
            raise ValueError("continue_final_message needs add_generation_prompt: false (vLLM's rule)")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return _logprobs_limit("top_logprobs", v)

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, v: list[Any] | None) -> list[Any] | None:
        if v:
            raise ValueError("tools (function calling) are not supported by this server")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if v is not None and v != "none":
            raise ValueError(f"tool_choice {v!r} is not supported by this server (no function calling); only 'none'")
        return v


class UsageInfo(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int = 0


class ErrorInfo(BaseModel):
    """OpenAI's error object: ``param`` names the offending field (or None)."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """``{"error": {...}}``, the body of every non-2xx answer."""

    error: ErrorInfo


class ModelCard(BaseModel):
    """One entry of ``GET /v1/models``; ``version`` is trtcore's: the engine file's SHA-256
    and its build plan, where an engine file is served (None for an engine built at start-up)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "trtcore"
    root: str | None = None
    max_model_len: int | None = None
    version: dict[str, Any] | None = None


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


# responses ---------------------------------------------------------------------------------
class CompletionLogprobs(BaseModel):
    """A completion choice's ``logprobs`` (legacy format): per token its text, its
    log-probability, the top tokens' ``{text: logprob}`` and its offset in the text."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    """One choice of a completion (or of a streamed chunk: ``text`` is the delta)."""

    index: int = 0
    text: str = ""
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    """``/v1/completions``'s answer and its streamed chunks (both ``"text_completion"``)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    """One alternative token of a chat logprobs entry."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprob(TopLogprob):
    """One generated token's chat logprobs entry, with the ``top_logprobs`` alternatives."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    """A chat choice's ``logprobs``."""

    content: list[ChatLogprob] | None = None


class ChatResponseMessage(BaseModel):
    """The assistant's message (or a streamed ``delta``: fields unset are left out)."""

    role: str | None = None
    content: str | None = None


class ChatChoice(BaseModel):
    """One choice of a chat completion."""

    index: int = 0
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    """``/v1/chat/completions``'s answer."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class ChatStreamChoice(BaseModel):
    """One choice of a streamed chat chunk."""

    index: int = 0
    delta: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    """A streamed chat chunk (``"chat.completion.chunk"``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
