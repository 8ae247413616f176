"""OpenTelemetry traces of runs, model calls, cells and host calls (the only OTel user).

Spans follow the OpenTelemetry GenAI semantic conventions, so a tracing backend (Jaeger,
Langfuse, Phoenix, anything that takes OTLP) shows an agent's whole tree:

* ``invoke_agent {agent}`` (INTERNAL): one run of a session (:func:`agent_span`);
* ``chat {model}`` (CLIENT): one model call, the loop's or a ``predict``'s (:func:`chat_span`);
* ``sunroom.cell`` (INTERNAL): one cell a kernel runs (:func:`cell_span`);
* ``execute_tool {name}`` (INTERNAL): one host-function or MCP-tool call from a session's
  kernel (:func:`tool_span`), a child of the cell that made it; a ``predict``'s ``chat`` is a
  child of its ``execute_tool predict`` (or ``predict_many``);
* ``sunroom.fork`` and ``sunroom.template`` (INTERNAL): a kernel forked into copies, a
  template's kernel made; the copies' and the template kernels' spans *link* to them.

Spans go to the globally configured ``TracerProvider`` (``opentelemetry.trace.
set_tracer_provider``), under the tracer ``"sunroom"``; without one, the OpenTelemetry API
records nothing. Without the OpenTelemetry API installed (the ``otel`` extra), every helper
here is a no-op that costs a check of one module-level value: nothing is imported or
allocated. OpenTelemetry is imported on first use, never by ``import sunroom``.

Privacy: by default no span records code, prompts, completions, arguments or results; only
names, counts, sizes, ids and the type names of errors (never their messages, which may hold
data). An error sets the span's status to ERROR with the exception's type name. Setting the
standard ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` opts in to the messages of
model calls (as the model was sent them: redacted) and the code of cells
(:func:`captures_content`).

:func:`export_otlp` configures the global provider to send spans to an OTLP/HTTP collector
(what ``sunroom serve --otlp-endpoint`` does); a library user configures their own.

Host calls are served by the kernel channel's reader, not in the cell's task, so the cell's
context does not flow into them: the kernel keeps its running cell's context
(:func:`current_context`) and its serving attaches it to each call (:func:`within`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from sunroom.errors import UsageError
from sunroom.extras import require

if TYPE_CHECKING:
    from types import ModuleType

    # re-exported for the annotations of the modules that hold contexts and links
    from opentelemetry.context import Context as Context
    from opentelemetry.trace import Link as Link
    from opentelemetry.trace import Span as Span
    from opentelemetry.trace import Tracer
    from opentelemetry.util.types import AttributeValue

__all__ = [
    "Attributes",
    "agent_span",
    "annotate",
    "captures_content",
    "cell_span",
    "chat_span",
    "current_context",
    "end",
    "export_otlp",
    "fork_span",
    "links_to",
    "provider_of",
    "quiet",
    "record_response",
    "record_run",
    "start_agent_span",
    "template_span",
    "tool_span",
    "use",
    "within",
]

Attributes = Mapping[str, "AttributeValue"]
"""Span attributes: names to str, bool, int, float or sequences of one of them."""

Kind = Literal["internal", "client"]

OPERATION: Final = "gen_ai.operation.name"
_NULL: Final = contextlib.nullcontext()
"""What every helper returns without OpenTelemetry (reusable: it holds no state)."""

# The names of gen_ai.provider.name for sunroom's adapters (their ``provider`` attribute).
_PROVIDERS: Final = {"anthropic": "anthropic", "openai": "openai", "gemini": "gcp.gemini"}


@dataclass(frozen=True, slots=True)
class _Otel:
    """The OpenTelemetry API, once imported: its trace and context modules and our tracer."""

    trace: ModuleType
    context: ModuleType
    tracer: Tracer


_loaded = False
_otel: _Otel | None = None


def _api() -> _Otel | None:
    """The OpenTelemetry API (imported on the first call), or None when it is not installed."""
    global _loaded, _otel
    if _loaded:
        return _otel
    try:
        import opentelemetry.context as context
        import opentelemetry.trace as trace
    except ImportError:
        _otel = None
    else:
        try:
            version: str | None = importlib.metadata.version("sunroom")
        except importlib.metadata.PackageNotFoundError:
            version = None
        _otel = _Otel(trace=trace, context=context, tracer=trace.get_tracer("sunroom", version))
    _loaded = True
    return _otel


def _provided(otel: _Otel) -> bool:
    """Whether a tracer provider is set: without one every span would be a no-op.

    A cell then gets no span at all (None, as inside :func:`quiet`): starting a no-op span
    and making it current cost about a fifth of the host's work per ``execute``. Asked at
    each call, since a provider may be set at any time.
    """
    provider = otel.trace.get_tracer_provider()
    return not isinstance(provider, otel.trace.ProxyTracerProvider | otel.trace.NoOpTracerProvider)


def _start(
    otel: _Otel, name: str, *, kind: Kind, attributes: Attributes, links: Sequence[Link] = ()
) -> Span:
    """A span started as a child of the current context (not made current)."""
    trace = otel.trace
    span: Span = otel.tracer.start_span(
        name,
        kind=trace.SpanKind.CLIENT if kind == "client" else trace.SpanKind.INTERNAL,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    )
    return span


@contextlib.contextmanager
def _current(otel: _Otel, span: Span, *, end: bool) -> Iterator[Span]:
    """*span* current for the block (ended after it if *end*); an exception sets ERROR."""
    token = otel.context.attach(otel.trace.set_span_in_context(span))
    try:
        yield span
    except BaseException as exc:
        _fail(otel, span, type(exc).__name__)
        raise
    finally:
        otel.context.detach(token)
        if end:
            span.end()


def _span(
    otel: _Otel, name: str, *, kind: Kind, attributes: Attributes, links: Sequence[Link] = ()
) -> contextlib.AbstractContextManager[Span]:
    """A span made current for the block, ended after it; an exception sets ERROR by type."""
    span = _start(otel, name, kind=kind, attributes=attributes, links=links)
    return _current(otel, span, end=True)


def _fail(otel: _Otel, span: Span, error_type: str) -> None:
    span.set_attribute("error.type", error_type)
    span.set_status(otel.trace.Status(otel.trace.StatusCode.ERROR, error_type))


def annotate(span: Span | None, attributes: Attributes, *, error: str | None = None) -> None:
    """Add *attributes* to *span* (None: no-op); *error*, an error's type name, sets ERROR."""
    if span is None:
        return
    otel = _api()
    assert otel is not None  # a span exists only where the API does
    span.set_attributes(attributes)
    if error is not None:
        _fail(otel, span, error)


def agent_span(
    *, agent: str, model: object, conversation_id: str | None, links: Sequence[Link] = ()
) -> contextlib.AbstractContextManager[Span | None]:
    """The span of one agent run: ``invoke_agent {agent}``, current for the block.

    *agent* is the preset (``codeact``, ``rlm``, ``typed``); *model* the root model (its
    :func:`provider_of` is the span's provider); *conversation_id* the session's id; *links*
    point at the fork the session's kernel came from, if any. Record the run's end with
    :func:`record_run`.
    """
    span = start_agent_span(agent=agent, model=model, conversation_id=conversation_id, links=links)
    if span is None:
        return _NULL
    otel = _api()
    assert otel is not None
    return _current(otel, span, end=True)


def start_agent_span(
    *, agent: str, model: object, conversation_id: str | None, links: Sequence[Link] = ()
) -> Span | None:
    """:func:`agent_span` started, not made current: :func:`use` makes it, :func:`end` ends it.

    For a branched run, which forks before its task starts.
    """
    otel = _api()
    if otel is None:
        return None
    attributes: dict[str, AttributeValue] = {
        OPERATION: "invoke_agent",
        "gen_ai.agent.name": agent,
        "gen_ai.provider.name": provider_of(model),
    }
    if conversation_id is not None:
        attributes["gen_ai.conversation.id"] = conversation_id
    return _start(
        otel, f"invoke_agent {agent}", kind="internal", attributes=attributes, links=links
    )


def record_run(
    span: Span | None, *, status: str, turns: int, input_tokens: int, output_tokens: int
) -> None:
    """Record a run's end on its agent span: any *status* but ``success`` sets ERROR."""
    if span is None:
        return
    attributes: dict[str, AttributeValue] = {
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "sunroom.run.status": status,
        "sunroom.run.turns": turns,
    }
    annotate(span, attributes, error=None if status == "success" else status)


def use(span: Span | None) -> contextlib.AbstractContextManager[Span | None]:
    """Make *span* current for the block without ending it; an exception sets it to ERROR."""
    if span is None:
        return _NULL
    otel = _api()
    assert otel is not None
    return _current(otel, span, end=False)


def end(span: Span | None) -> None:
    """End *span* (None: no-op)."""
    if span is not None:
        span.end()


def provider_of(model: object) -> str:
    """The ``gen_ai.provider.name`` of *model* (a :class:`~sunroom.providers.Model`).

    sunroom's adapters name their family in ``provider``; it maps to the convention's names
    (``gemini`` is ``gcp.gemini``; an ``openai-compatible`` model without a base URL talks to
    ``openai``), another family keeps its own name, and a model that names none (a custom or
    fake one) is ``sunroom.custom``.
    """
    provider = getattr(model, "provider", None)
    if not isinstance(provider, str) or not provider:
        return "sunroom.custom"
    if provider == "openai-compatible":
        base_url = getattr(getattr(model, "config", None), "base_url", None)
        return "openai" if base_url is None else provider
    return _PROVIDERS.get(provider, provider)


def chat_span(model: object) -> contextlib.AbstractContextManager[Span | None]:
    """The span of one call of *model*: ``chat {model.name}`` (CLIENT), current for the block.

    Its provider is :func:`provider_of`; record the reply with :func:`record_response`.
    """
    otel = _api()
    if otel is None:
        return _NULL
    name = getattr(model, "name", "")
    attributes: dict[str, AttributeValue] = {
        OPERATION: "chat",
        "gen_ai.provider.name": provider_of(model),
    }
    if isinstance(name, str) and name:
        attributes["gen_ai.request.model"] = name
        return _span(otel, f"chat {name}", kind="client", attributes=attributes)
    return _span(otel, "chat", kind="client", attributes=attributes)


def record_response(
    span: Span | None,
    *,
    model: str,
    response_id: str | None,
    finish_reason: str,
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    reasoning_tokens: int = 0,
) -> None:
    """Record a model's reply on its :func:`chat_span`: model, id, finish reason, tokens.

    A reply that stopped with ``error`` or ``content_filter`` sets the span's status to ERROR.
    """
    if span is None:
        return
    attributes: dict[str, AttributeValue] = {
        "gen_ai.response.finish_reasons": (finish_reason,),
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
    }
    if model:
        attributes["gen_ai.response.model"] = model
    if response_id:
        attributes["gen_ai.response.id"] = response_id
    if cache_read_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = cache_read_tokens
    if cache_write_tokens:
        attributes["gen_ai.usage.cache_creation.input_tokens"] = cache_write_tokens
    if reasoning_tokens:
        attributes["gen_ai.usage.reasoning.output_tokens"] = reasoning_tokens
    failed = finish_reason in ("error", "content_filter")
    annotate(span, attributes, error=finish_reason if failed else None)


_QUIET: Final = contextvars.ContextVar("sunroom_trace_quiet", default=False)


@contextlib.contextmanager
def _quieted() -> Iterator[None]:
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def quiet() -> contextlib.AbstractContextManager[None]:
    """No cell span for the cells run in the block: sunroom's own setup (a session's helpers)."""
    if _api() is None:
        return _NULL
    return _quieted()


def cell_span(
    *, index: int, code_length: int, links: Sequence[Link] = ()
) -> contextlib.AbstractContextManager[Span | None]:
    """The span of one cell: ``sunroom.cell``, current for the block (never the code).

    *index* counts the kernel handle's cells from 1; *links* point at the fork or template
    the kernel came from. Record the outcome with :func:`annotate`. None inside :func:`quiet`
    and while no tracer provider is set (nothing would record it).
    """
    otel = _api()
    if otel is None or _QUIET.get() or not _provided(otel):
        return _NULL
    attributes = {"sunroom.cell.index": index, "sunroom.cell.code_length": code_length}
    return _span(otel, "sunroom.cell", kind="internal", attributes=attributes, links=links)


def tool_span(*, name: str, call_id: int) -> contextlib.AbstractContextManager[Span | None]:
    """The span of one host-function or MCP-tool call: ``execute_tool {name}``, current.

    *call_id* is the call's id in the session's ``HostCallStarted`` event. Its parent is the
    current context: the cell's, attached by the kernel's serving (:func:`within`).
    """
    otel = _api()
    if otel is None:
        return _NULL
    attributes = {
        OPERATION: "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": str(call_id),
        "gen_ai.tool.type": "function",
    }
    return _span(otel, f"execute_tool {name}", kind="internal", attributes=attributes)


def fork_span(*, copies: int) -> contextlib.AbstractContextManager[Span | None]:
    """The span of a kernel's fork into *copies*: ``sunroom.fork``; copies link to it."""
    otel = _api()
    if otel is None:
        return _NULL
    attributes = {"sunroom.fork.copies": copies}
    return _span(otel, "sunroom.fork", kind="internal", attributes=attributes)


def template_span(
    *, warm: bool, setup_length: int
) -> contextlib.AbstractContextManager[Span | None]:
    """The span of a template's kernel made and set up: ``sunroom.template``.

    *warm*: the kernel is the zygote that later kernels fork from (else one started apart).
    Kernels from the template link to it.
    """
    otel = _api()
    if otel is None:
        return _NULL
    attributes = {"sunroom.template.warm": warm, "sunroom.template.setup_length": setup_length}
    return _span(otel, "sunroom.template", kind="internal", attributes=attributes)


CAPTURE_CONTENT: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The standard variable that opts in to recording content (``true``, ``span_only`` or
``span_and_event``; anything else, or unset: no content)."""


def captures_content() -> bool:
    """Whether spans may record content: messages sent to and from models, and cells' code.

    Off unless :data:`CAPTURE_CONTENT` opts in (read at each call, so it can change at run
    time); always off without OpenTelemetry.
    """
    if _api() is None:
        return False
    value = os.environ.get(CAPTURE_CONTENT, "").strip().lower()
    return value in ("true", "span_only", "span_and_event")


def links_to(span: Span | None) -> tuple[Link, ...]:
    """Links to *span* for later spans (empty for None or a span that records nothing)."""
    if span is None:
        return ()
    otel = _api()
    assert otel is not None
    context = span.get_span_context()
    return (otel.trace.Link(context),) if context.is_valid else ()


def current_context() -> Context | None:
    """The current OpenTelemetry context, to parent work done outside this task (or None)."""
    otel = _api()
    if otel is None:
        return None
    current: Context = otel.context.get_current()
    return current


class _Attached:
    """*context* attached for the block.

    A class: a generator's context manager cost each host call four more Python calls.
    """

    __slots__ = ("_context", "_otel", "_token")

    def __init__(self, otel: _Otel, context: Context) -> None:
        self._otel = otel
        self._context = context
        self._token: object = None

    def __enter__(self) -> None:
        self._token = self._otel.context.attach(self._context)

    def __exit__(self, *exc: object) -> None:
        self._otel.context.detach(self._token)


def within(context: Context | None) -> contextlib.AbstractContextManager[None]:
    """Make *context* (from :func:`current_context`) current for the block.

    None makes an empty context current: spans in the block start traces of their own (a
    host call outside any cell, from a thread a cell left running), never children of
    whatever the serving task happened to inherit.
    """
    otel = _api()
    if otel is None:
        return _NULL
    return _Attached(otel, otel.context.Context() if context is None else context)


def export_otlp(endpoint: str | None) -> Callable[[], None]:
    """Send every span of this process to an OTLP/HTTP collector; returns the flush-and-stop.

    Sets the global ``TracerProvider``: resource ``service.name`` ``sunroom`` (or
    ``OTEL_SERVICE_NAME``), a batch processor and an OTLP/HTTP (protobuf) span exporter. The
    *endpoint* is the collector's base URL, as ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
    (``/v1/traces`` is added); None leaves the exporter to the standard ``OTEL_EXPORTER_OTLP_*``
    variables (headers, such as a backend's credentials, come from
    ``OTEL_EXPORTER_OTLP_HEADERS`` either way). Call the returned function once, at exit: it
    exports the spans still batched and stops.

    Raises UsageError when the ``otel`` extra is not installed or *endpoint* is no HTTP URL.
    """
    require("otel", "tracing to an OTLP endpoint")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise UsageError("the OTLP endpoint must be an http:// or https:// URL")  # not echoed
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if endpoint is None:
        exporter = OTLPSpanExporter()
    else:
        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
    name = os.environ.get("OTEL_SERVICE_NAME") or "sunroom"
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    shutdown: Callable[[], None] = provider.shutdown
    return shutdown
