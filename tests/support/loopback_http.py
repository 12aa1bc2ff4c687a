# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A loopback HTTP server for a client under test: each GET is answered by a function of the request."""

from __future__ import annotations

import http.server
import threading
from typing import Callable, Tuple


class LoopbackJSON:
    """Listens on 127.0.0.1 on a free port (``url``) until ``close()``; ``requests`` keeps (path, headers) of each
    GET in order."""

    def __init__(self, answer: Callable[[str, object], Tuple[int, str]]):
        self.requests: list = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server name
                outer.requests.append((self.path, self.headers))
                status, body = answer(self.path, self.headers)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
