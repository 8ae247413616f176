"""``sunroom serve --otlp-endpoint``: a session's spans reach an OTLP/HTTP collector.

A real ``sunroom serve`` (subprocess backend, the scripted model) exports to a tiny collector
on 127.0.0.1 that keeps every protobuf POST to ``/v1/traces``; after SIGTERM the server has
flushed its batch, and the decoded spans form the session's tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from typer.testing import CliRunner

from sunroom.cli import app
from sunroom.errors import UsageError
from sunroom.tracing import export_otlp
from tests.service.conftest import TOKEN

ROOT = Path(__file__).resolve().parents[2]


class _Collector(ThreadingHTTPServer):
    """Keeps the body of every POST to /v1/traces."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.posts: list[tuple[str, str, bytes]] = []  # (path, content type, body)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.posts.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass


@contextlib.contextmanager
def _collector() -> Iterator[_Collector]:
    server = _Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _value(v: AnyValue) -> object:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def _attributes(kvs: Iterator[KeyValue] | list[KeyValue]) -> dict[str, object]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _greet(url: str) -> str:
    """Run one session on the service at *url* to success; its id."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.get("/healthz").json()["ok"]:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
        sid: str = client.post("/sessions", json={"task": "greet"}).json()["session_id"]
        r = client.get(f"/sessions/{sid}/result", params={"timeout": 60})
        assert r.status_code == 200, r.text
        assert r.json()["result"]["status"] == "success", r.text
    return sid


def _serve_one_session(argv: list[str], env: dict[str, str]) -> str:
    """Start ``sunroom serve`` with *argv*, run one session, SIGTERM it; the session's id."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sunroom.cli", "serve", *argv],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert "listening on" in line, (line, proc.stderr.read() if proc.poll() else "")
        sid = _greet(line.rsplit(" ", 1)[-1].strip())
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
    return sid


def _spans(posts: list[tuple[str, str, bytes]]) -> list[Span]:
    """The spans of the collector's POSTs, checking each request's path, type and resource."""
    assert posts, "nothing was exported"
    spans: list[Span] = []
    for path, content_type, body in posts:
        assert path == "/v1/traces" and content_type == "application/x-protobuf"
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            assert resource["service.name"] == "sunroom", resource
            for scope_spans in resource_spans.scope_spans:
                assert scope_spans.scope.name == "sunroom"
                spans.extend(scope_spans.spans)
    return spans


@pytest.mark.kernel
@pytest.mark.parametrize("given_by", ["option", "variable"])
def test_serve_exports_a_sessions_spans_over_otlp_http(tmp_path: Path, given_by: str) -> None:
    script = {"replies": [{"code": "print(predict('Say hi.', 'someone'))"}, "done"]}
    (tmp_path / "script.json").write_text(json.dumps(script))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {"SUNROOM_TOKEN": TOKEN, "SUNROOM_MODEL": f"scripted:{tmp_path / 'script.json'}"}
    argv = ["--port", "0", "--db", str(tmp_path / "s.db"), "--backend", "subprocess"]
    with _collector() as collector:
        if given_by == "option":
            argv += ["--otlp-endpoint", collector.url]
        else:  # the standard variable, read by the exporter itself
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.url
        sid = _serve_one_session(argv, env)
        spans = _spans(list(collector.posts))

    by_name: dict[str, list[Span]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    (agent,) = by_name["invoke_agent codeact"]
    assert agent.kind == Span.SPAN_KIND_INTERNAL
    a = _attributes(agent.attributes)
    assert a["gen_ai.conversation.id"] == sid and a["gen_ai.operation.name"] == "invoke_agent"
    chats = by_name["chat scripted"]
    assert len(chats) == 3  # two turns and the predict
    assert all(c.kind == Span.SPAN_KIND_CLIENT for c in chats)
    turns = [c for c in chats if c.parent_span_id == agent.span_id]
    assert len(turns) == 2
    for c in turns:
        ca = _attributes(c.attributes)
        assert ca["gen_ai.request.model"] == "scripted"
        assert isinstance(ca["gen_ai.usage.input_tokens"], int)
        assert ca["gen_ai.usage.input_tokens"] > 0
    cells = [c for c in by_name["sunroom.cell"] if c.parent_span_id == agent.span_id]
    assert len(cells) == 1
    (tool,) = by_name["execute_tool predict"]
    assert tool.parent_span_id == cells[0].span_id
    (predicted,) = [c for c in chats if c.parent_span_id == tool.span_id]
    assert predicted.trace_id == agent.trace_id


def test_an_endpoint_that_is_no_http_url_fails_before_listening_and_is_not_echoed() -> None:
    endpoint = "grpc://user:s3cret@127.0.0.1:4317"
    result = CliRunner().invoke(
        app, ["serve", "--port", "0", "--backend", "subprocess", "--otlp-endpoint", endpoint]
    )
    assert result.exit_code == 2, result.output
    assert "OTLP endpoint must be an http:// or https:// URL" in result.output
    assert "s3cret" not in result.output and "listening" not in result.output
    with pytest.raises(UsageError, match="http:// or https://"):
        export_otlp("127.0.0.1:4318")
