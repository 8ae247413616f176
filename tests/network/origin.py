"""A loopback HTTP server for the network tests: each GET is answered by a function of its
path and headers (the kernel reaches it only through its proxy)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from email.message import Message

Answer = Callable[[str, Message], bytes]
"""``(path, headers) -> body`` of a 200 answer."""


@contextmanager
def serving(answer: Answer) -> Iterator[int]:
    """Serve *answer* on 127.0.0.1 at a free port (yielded) until the block ends."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = answer(self.path, self.headers)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
