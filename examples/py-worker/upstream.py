"""The statements service the workers write to: a ledger of statement lines
per account, in memory. POST /accounts/{acct}/lines appends the body as a
line (with the Fencing-Token the gateway added); GET /accounts/{acct}/lines
lists them as JSON. It knows nothing of leases: like the service in the
incident, it applies every write it receives.

    python3 upstream.py            # prints: listening on http://127.0.0.1:PORT
"""

from __future__ import annotations

import http.server
import json
import re
import sys
import threading
from typing import Dict, List

LINES = re.compile(r"^/accounts/([^/?]+)/lines$")
ledger: Dict[str, List[dict]] = {}
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, doc: object) -> None:
        out = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        m = LINES.match(self.path)
        if not m:
            return self._answer(404, {"error": "no such path"})
        line = {"line": body.decode("utf-8", "replace"), "token": self.headers.get("Fencing-Token")}
        with lock:
            ledger.setdefault(m.group(1), []).append(line)
            n = len(ledger[m.group(1)])
        self._answer(201, {"lines": n})

    def do_GET(self) -> None:
        m = LINES.match(self.path)
        if not m:
            return self._answer(404, {"error": "no such path"})
        with lock:
            self._answer(200, list(ledger.get(m.group(1), [])))

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0), Handler)
    print(f"listening on http://127.0.0.1:{srv.server_address[1]}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
