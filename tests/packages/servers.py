"""Package index servers on 127.0.0.1 for the tests: a PEP 503 simple index, and one that stalls."""

from __future__ import annotations

import hashlib
import html
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@contextmanager
def simple_index(wheelhouse: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve the wheels of *wheelhouse* as a PEP 503 index; yields (index URL, paths asked)."""
    wheels = {p.name: p for p in wheelhouse.glob("*.whl")}
    asked: list[str] = []

    def project(name: str) -> str:
        links = []
        for file, path in sorted(wheels.items()):
            if file.split("-")[0].lower().replace("_", "-") == name:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                links.append(f'<a href="/files/{html.escape(file)}#sha256={digest}">{file}</a>')
        return "<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            body: bytes | None = None
            kind = "text/html"
            if parts[:1] == ["simple"] and len(parts) == 2:
                page = project(parts[1].lower())
                body = page.encode() if "<a " in page else None
            elif parts[:1] == ["files"] and len(parts) == 2 and parts[1] in wheels:
                body, kind = wheels[parts[1]].read_bytes(), "application/octet-stream"
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # quiet: the test reads `asked`

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def stalling_index() -> Iterator[str]:
    """A server that accepts connections and never answers; yields its index URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/simple/"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()
