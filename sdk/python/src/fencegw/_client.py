"""The Client: talks to one gateway, acquires leases, reads resources."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.parse
from typing import Any, Dict, Mapping, Optional

from ._errors import OP_ACQUIRE, FencegwError, answer_error, transport_error
from ._http import TRANSPORT_ERRORS, Endpoint, Response
from ._lease import Lease, _client_time

#: The lease TTL when none is given, in seconds: a renewal every 5 s survives
#: a few slow or failed round trips; a crashed worker's resource is free again
#: within seconds.
DEFAULT_TTL = 15.0
#: Bounds the release made when a ``with`` block ends, in seconds. A lease
#: that could not be released expires on its own after its TTL.
DEFAULT_CLOSE_TIMEOUT = 5.0
#: Bounds connecting to the gateway and each read of a control call or a
#: fenced write, in seconds; above the gateway's default forward timeout (30 s)
#: so that its 504 arrives before the SDK gives up.
DEFAULT_TIMEOUT = 60.0


class Client:
    """Talks to one fencegw gateway. Safe for use from several threads.

    Args:
        base_url: the gateway, ``"http://127.0.0.1:8080"``.
        holder: the label of acquired leases, shown on the dashboard and in
            rejections (at most 128 bytes); default ``"HOSTNAME/PID"``.
        api_key: sent as ``Authorization: Bearer KEY`` when the gateway runs
            with ``--auth-file``.
        timeout: bounds connecting and each read, in seconds.
        close_timeout: bounds the release made when a ``with`` block ends.
    """

    def __init__(
        self,
        base_url: str,
        holder: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
    ) -> None:
        self._endpoint = Endpoint(base_url)
        self.base_url = self._endpoint.url()
        self.holder = holder or f"{socket.gethostname() or 'worker'}/{os.getpid()}"
        self._api_key = api_key
        self.timeout = timeout
        self.close_timeout = close_timeout

    def lease(
        self,
        resource: str,
        ttl: float = DEFAULT_TTL,
        wait: float = 0.0,
        *,
        holder: Optional[str] = None,
        safety_margin: Optional[float] = None,
    ) -> Lease:
        """Acquires ``resource`` and returns its Lease, renewed in the
        background until released or lost. Use it as a context manager::

            with client.lease("stmt:acct:88213", ttl=10, wait=30) as lease:
                lease.request("POST", "statements", "/accounts/88213/lines", body=...)

        Args:
            resource: 1-256 bytes of ``A-Z a-z 0-9 . _ : @ / -``.
            ttl: the lease's duration in seconds, measured by the gateway
                (0.1 to 3600); renewals ask for the same.
            wait: how long the gateway may wait for a held resource to become
                free, in seconds (at most 60); 0 answers at once.
            holder: this lease's label; default the client's.
            safety_margin: subtracted from the TTL when the SDK decides, on
                its monotonic clock, that the lease ran out; default TTL/10.

        Raises:
            LeaseHeld: another lease holds the resource (``holder``,
                ``retry_after``).
            Unavailable: a 503 (``fence_busy`` when the wait ran out while
                writes under the previous token were still in flight), or no
                answer from the gateway.
            InvalidRequest: bad input (``field`` names it).
            LeaseLost: the acquire waited longer than a renewal period, and
                the renewal made before handing the lease out (its time is
                counted from the acquire's send) was answered ``lease_lost``.
        """
        body: Dict[str, Any] = {"resource": resource, "holder": holder or self.holder, "ttl_ms": int(round(ttl * 1000))}
        if wait > 0:
            body["wait_ms"] = int(round(wait * 1000))
        # The lease's time is counted from here, on the monotonic clock: the
        # gateway starts its own count only once the request arrives, later.
        sent = time.monotonic()
        try:
            resp = self._call("POST", "/v1/leases", body, timeout=self.timeout + wait, client_time=_client_time(0))
        except TRANSPORT_ERRORS as exc:  # no answer from the gateway
            raise transport_error(OP_ACQUIRE, exc) from exc
        rtt = time.monotonic() - sent
        if resp.status != 201:
            raise answer_error(OP_ACQUIRE, resp.status, resp.headers, resp.body)
        margin = ttl / 10 if safety_margin is None else max(safety_margin, 0.0)
        lease = Lease(self, self._json(resp), ttl, margin, sent, rtt)
        lease._begin(sent)
        return lease

    acquire = lease
    """Another name for ``lease``, for callers that release it themselves."""

    def resource(self, name: str) -> Dict[str, Any]:
        """The gateway's view of a resource (``held``, ``token``,
        ``holder``, ...), from ``GET /v1/resources/{name}`` with the name
        percent-encoded (``inventory%2FSKU-001``)."""
        try:
            resp = self._call("GET", "/v1/resources/" + urllib.parse.quote(name, safe=""), None)
        except TRANSPORT_ERRORS as exc:  # no answer from the gateway
            raise transport_error("resource", exc) from exc
        if resp.status != 200:
            raise answer_error("resource", resp.status, resp.headers, resp.body)
        return self._json(resp)

    # --- plumbing shared with Lease ---------------------------------------

    def _headers(self) -> Dict[str, str]:
        h = {"User-Agent": "fencegw-python"}
        if self._api_key:
            h["Authorization"] = f"Bearer {self._api_key}"
        return h

    def _exchange(
        self,
        method: str,
        path: str,
        body: Optional[bytes],
        headers: Mapping[str, str],
        timeout: Optional[float],
    ) -> Response:
        h = self._headers()
        h.update(headers)
        return self._endpoint.exchange(method, path, body, h, self.timeout if timeout is None else timeout)

    def _call(
        self,
        method: str,
        path: str,
        doc: Optional[Mapping[str, Any]],
        *,
        timeout: Optional[float] = None,
        client_time: Optional[str] = None,
    ) -> Response:
        """A control call with a JSON body; raises the transport's error if
        no answer came."""
        headers = {"Accept": "application/json, application/problem+json"}
        data = None
        if doc is not None:
            data = json.dumps(doc).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if client_time is not None:
            headers["Fencing-Client-Time"] = client_time
        return self._exchange(method, path, data, headers, timeout)

    @staticmethod
    def _json(resp: Response) -> Dict[str, Any]:
        try:
            doc = json.loads(resp.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise FencegwError(f"fencegw: the gateway's {resp.status} answer is not JSON: {exc}", status=resp.status) from exc
        if not isinstance(doc, dict):
            raise FencegwError(f"fencegw: the gateway's {resp.status} answer is not a JSON object", status=resp.status)
        return doc

    def __repr__(self) -> str:
        return f"<fencegw.Client {self.base_url} holder={self.holder!r}>"
