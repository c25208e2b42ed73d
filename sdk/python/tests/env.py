"""The real parts the SDK's tests run against: the fencegw binary (built
from this repository, or FENCEGW_BIN), an upstream HTTP server that records
what reaches it, and a TCP proxy between the SDK and the gateway that can cut
connections. Nothing here fakes the gateway."""

from __future__ import annotations

import atexit
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import unittest
import urllib.request
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

_binary: Optional[str] = None
_binary_lock = threading.Lock()


def gateway_binary() -> str:
    """The fencegw binary: $FENCEGW_BIN, else `go build ./cmd/fencegw` once.
    Fails (never skips) when neither works."""
    global _binary
    with _binary_lock:
        if _binary:
            return _binary
        path = os.environ.get("FENCEGW_BIN")
        if path:
            if not os.access(path, os.X_OK):
                raise RuntimeError(f"FENCEGW_BIN={path} is not an executable")
            _binary = path
            return path
        if shutil.which("go") is None:
            raise RuntimeError("the tests need the fencegw binary: set FENCEGW_BIN or install Go to build it")
        bindir = tempfile.mkdtemp(prefix="fencegw-pysdk-bin-")
        atexit.register(shutil.rmtree, bindir, True)
        out = os.path.join(bindir, "fencegw")
        subprocess.run(["go", "build", "-o", out, "./cmd/fencegw"], cwd=REPO, check=True, timeout=600)
        _binary = out
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    """A `fencegw serve` process on a free loopback port with a temporary
    embedded store, protecting `statements` (the given upstream) and `dead`
    (an address nothing listens on)."""

    def __init__(self, upstream_url: str, *extra: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="fencegw-pysdk-")
        self.log_path = os.path.join(self.dir, "gateway.log")
        self._log = open(self.log_path, "wb")
        args = [
            gateway_binary(), "serve", "--listen", "127.0.0.1:0", "--data", os.path.join(self.dir, "data"),
            "--shutdown-delay", "0", "--upstream", f"statements={upstream_url}",
            "--upstream", f"dead=http://127.0.0.1:{free_port()}", *extra,
        ]
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        self.url = self._wait_serving()

    def _wait_serving(self) -> str:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            with open(self.log_path, "rb") as f:
                m = re.search(rb"serving on (http://\S+)", f.read())
            if m:
                return m.group(1).decode()
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the gateway did not start: {self.log()}")

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read()[-4000:].decode(errors="replace")

    def pause(self) -> None:
        """SIGSTOP: the process freezes; the kernel still accepts connections."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """The gateway is gone at once (SIGKILL; SIGCONT first if paused)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=30)

    def close(self) -> None:
        self.kill()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # Calls the SDK does not make, for the tests' own checks.
    def call(self, method: str, path: str, doc: Optional[Dict[str, Any]] = None) -> Any:
        data = json.dumps(doc).encode() if doc is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
            return json.loads(body) if body else None

    def revoke(self, lease_id: str) -> Any:
        return self.call("POST", f"/v1/leases/{urllib.parse.quote(lease_id, safe='')}/revoke")

    def rejections(self, resource: str) -> List[Dict[str, Any]]:
        return self.call("GET", "/v1/rejections?resource=" + urllib.parse.quote(resource, safe=""))["items"]


class Arrival(dict):  # type: ignore[type-arg]
    """One request as the upstream saw it."""


class Upstream:
    """A protected service: records every request (method, raw path, body,
    Content-Type, Fencing-Token, whether Fencing-Lease leaked, the
    Idempotency-Key) and answers 201 "line added"; /conflict answers its own
    409 problem document."""

    PROBLEM = b'{"type":"https://statements.example/problems/duplicate","title":"Duplicate line","status":409}'

    def __init__(self) -> None:
        self.arrivals: List[Arrival] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with outer.lock:
                    outer.arrivals.append(Arrival(
                        method=self.command, path=self.path, body=body,
                        content_type=self.headers.get("Content-Type"),
                        token=int(self.headers.get("Fencing-Token") or 0),
                        had_lease=self.headers.get("Fencing-Lease") is not None,
                        key=self.headers.get("Idempotency-Key"),
                    ))
                if self.path.startswith("/conflict"):
                    status, ctype, out = 409, "application/problem+json", outer.PROBLEM
                else:
                    status, ctype, out = 201, "text/plain", b"line added"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def seen(self) -> List[Arrival]:
        with self.lock:
            return list(self.arrivals)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _hang_up(s: socket.socket) -> None:
    """Closes s so that the peer sees it at once: shutdown wakes a thread
    blocked reading it (close alone would not, and sends no FIN while it
    is)."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


class CutProxy:
    """A TCP proxy in front of the gateway that can break connections as a
    network does: `fail_renewals` renewals are dropped before they reach the
    gateway (the connection closes unanswered); `cut_writes` fenced writes
    reach the gateway, which answers, and the answer is lost (the connection
    closes before any of it is passed on). Counts what it sees."""

    def __init__(self, target_url: str) -> None:
        u = urllib.parse.urlsplit(target_url)
        self.target = (u.hostname or "127.0.0.1", u.port or 80)
        self.lock = threading.Lock()
        self.fail_renewals = 0
        self.cut_writes = 0
        self.renewals_failed = 0
        self.renewals_passed = 0
        self.writes = 0
        self.renewed = threading.Condition(self.lock)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        try:
            first = client.recv(65536)
            if not first:
                return
            line = first.split(b"\r\n", 1)[0]
            renewal, write = b"/renew " in line, b" /v1/proxy/" in line
            cut = False
            with self.lock:
                if renewal and self.fail_renewals > 0:
                    self.fail_renewals -= 1
                    self.renewals_failed += 1
                    return
                if renewal:
                    self.renewals_passed += 1
                    self.renewed.notify_all()
                if write:
                    self.writes += 1
                    if self.cut_writes > 0:
                        self.cut_writes -= 1
                        cut = True
            server = socket.create_connection(self.target, timeout=60)
            server.sendall(first)
            t = threading.Thread(target=self._pump, args=(client, server), daemon=True)
            t.start()
            if cut:
                # The gateway has the request; once its answer starts, lose it.
                server.recv(1)
                _hang_up(server)
                return
            self._pump(server, client)
            t.join(timeout=60)
            server.close()
        except OSError:
            pass
        finally:
            _hang_up(client)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                dst.sendall(b)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def wait_renewals(self, passed: int, timeout: float = 30) -> None:
        """Waits until `passed` renewals in all have reached the gateway."""
        with self.lock:
            if not self.renewed.wait_for(lambda: self.renewals_passed >= passed, timeout):
                raise AssertionError(f"only {self.renewals_passed} renewals passed within {timeout}s")

    def close(self) -> None:
        self.sock.close()


class GatewayTestCase(unittest.TestCase):
    """A real gateway in front of a recording upstream, shared by a class's
    tests and stopped after them; each test uses resources of its own."""

    up: Upstream
    gw: Gateway

    @classmethod
    def setUpClass(cls) -> None:
        cls.up = Upstream()
        cls.gw = Gateway(cls.up.url)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.gw.close()
        cls.up.close()
