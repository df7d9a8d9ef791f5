"""A webhook receiver on loopback for the tests: it records every request
(headers and body) and answers with the status codes it is given, in
order (the last one thereafter)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    url: str
    answers: list[int] = field(default_factory=lambda: [200])
    received: list[Received] = field(default_factory=list)

    def answer(self) -> int:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@contextmanager
def receiver_running(*answers: int) -> Iterator[Receiver]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with lock:
                receiver.received.append(
                    Received({k.lower(): v for k, v in self.headers.items()}, body)
                )
                code = receiver.answer()
            self.send_response(code)
            self.send_header("content-type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok" if code < 300 else b"try again")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(
        url=f"http://127.0.0.1:{server.server_port}/hooks", answers=list(answers or [200])
    )
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
