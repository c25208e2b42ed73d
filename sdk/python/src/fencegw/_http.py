"""One HTTP exchange with the gateway over the standard library's
http.client: a fresh connection per call (no pool to share between the
renewal thread and the worker's), the path sent exactly as given."""

from __future__ import annotations

import http.client
import ssl
import urllib.parse
from typing import Dict, NamedTuple, Optional, Tuple, Type

#: What a call raises when no answer came from the gateway (refused, cut,
#: timed out, TLS failure, a malformed answer). Anything else, such as a
#: path with a space (http.client's InvalidURL, a ValueError), is the
#: caller's mistake and propagates as it is.
TRANSPORT_ERRORS: Tuple[Type[BaseException], ...] = (OSError, http.client.HTTPException)


class Response(NamedTuple):
    """An HTTP answer, read whole.

    Attributes:
        status: the HTTP status code.
        headers: the answer's headers (case-insensitive ``headers["Content-Type"]``,
            ``headers.get_all("Set-Cookie")``).
        body: the answer's body.
    """

    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def replayed(self) -> bool:
        """Whether the gateway answered from its record of an earlier attempt
        with the same idempotency key, without reaching the upstream (the
        write was applied once, by that attempt)."""
        return bool(self.headers.get("Idempotent-Replayed") == "true")


class Endpoint:
    """Where the gateway is: scheme, host, port and base path."""

    def __init__(self, base_url: str) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"fencegw: gateway URL {base_url!r}: want http://HOST[:PORT] or https://...")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port
        self.base_path = u.path.rstrip("/")

    def url(self) -> str:
        """The base URL, normalised."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = f":{self.port}" if self.port else ""
        return f"{self.scheme}://{host}{port}{self.base_path}"

    def exchange(
        self,
        method: str,
        path: str,
        body: Optional[bytes],
        headers: Dict[str, str],
        timeout: float,
    ) -> Response:
        """Sends one request to base path + path and reads the whole answer.
        timeout bounds connecting and each read (socket timeout). Raises
        OSError or http.client.HTTPException when no answer arrives."""
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            # skip_accept_encoding: the body comes back as the upstream sent it.
            conn.putrequest(method, self.base_path + path, skip_accept_encoding=True)
            has_length = False
            for k, v in headers.items():
                conn.putheader(k, v)
                has_length = has_length or k.lower() == "content-length"
            if body is not None and not has_length:
                conn.putheader("Content-Length", str(len(body)))
            elif body is None and method.upper() in ("POST", "PUT", "PATCH") and not has_length:
                conn.putheader("Content-Length", "0")
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            return Response(resp.status, resp.headers, data)
        finally:
            conn.close()
