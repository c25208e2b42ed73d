"""The Lease: one grant of a resource, renewed in the background, whose loss
is signalled through ``lost``, and under which fenced writes go to an
upstream through the gateway's proxy."""

from __future__ import annotations

import logging
import random
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Type, Union

from ._errors import (
    OP_RELEASE,
    OP_RENEW,
    OP_WRITE,
    FencegwError,
    IdempotencyConflict,
    LeaseLost,
    StaleLease,
    Unavailable,
    UpstreamFailed,
    answer_error,
    gateway_problem,
    transport_error,
)
from ._http import TRANSPORT_ERRORS, Response

if TYPE_CHECKING:
    from types import TracebackType

    from ._client import Client

log = logging.getLogger("fencegw")

HEADER_LEASE = "Fencing-Lease"
HEADER_IDEMPOTENCY_KEY = "Idempotency-Key"

Body = Union[bytes, bytearray, str, None]


class Lease:
    """One grant of a resource, kept alive in the background.

    It is renewed every TTL/3; a failed renewal (no answer, a 503) is retried
    with backoff; it is lost when the gateway answers ``lease_lost``, when a
    fenced write under it is refused as stale, or when its TTL runs out on the
    local monotonic clock (minus the safety margin) without a successful
    renewal. Then ``lost`` is set and ``check()`` raises LeaseLost.

    Holding a Lease does NOT mean the lease is held: the process can stall
    past the TTL between any check and the next write. ``lost`` and
    ``check()`` stop work early in the common case; what keeps data safe is
    the gateway's fence: a write sent with ``request`` is refused
    (StaleLease) unless this lease is the resource's current one when the
    gateway admits it.

    Use it as a context manager (``with client.lease(...) as lease:``): the
    lease is released on exit, also when the block raises. Safe for use from
    several threads.
    """

    def __init__(
        self,
        client: "Client",
        doc: Mapping[str, Any],
        ttl: float,
        margin: float,
        sent: float,
        rtt: float,
    ) -> None:
        self._client = client
        self.id: str = doc["lease_id"]
        """The lease's secret, sent as Fencing-Lease with each write; never log it."""
        self.token: int = int(doc["token"])
        """The fencing token: larger than any granted before for the resource."""
        self.resource: str = doc["resource"]
        self.holder: str = doc.get("holder", "")
        self.ttl: float = ttl
        """The lease's duration in seconds, asked for at acquire and at each renewal."""
        self.margin: float = margin
        """Subtracted from the TTL when the SDK decides the lease ran out."""
        self.lost = threading.Event()
        """Set, once and for good, when the lease is lost (not on a clean
        release): by a background thread at the deadline, on a ``lease_lost``
        answer to a renewal, or on a stale write. After the whole process was
        frozen past the deadline it is set moments after it resumes;
        ``check()`` and ``error`` decide on the spot."""

        self._cond = threading.Condition()
        self._deadline: float = sent + doc["ttl_ms"] / 1000.0 - margin
        self._last_renewed = sent
        self._rtt = rtt
        self._error: Optional[LeaseLost] = None
        self._lost_at: Optional[float] = None
        self._last_failure: Optional[FencegwError] = None
        self._released = False
        self._stopping = False
        self._release_lock = threading.Lock()

    def _begin(self, sent: float) -> None:
        """Starts the renewals and the deadline's watch; the Client calls it
        once, before handing the lease out. An acquire that took longer than
        a renewal period (it waited for the resource) is renewed first: the
        gateway's count began at the grant, somewhere within the call, but
        only the call's send time is a safe local bound for it, and a lease
        counted from there could be lost on arrival. Raises the renewal's
        LeaseLost if the gateway says the lease is gone; any other failure is
        left to the keep-alive, which retries it at once."""
        every = max(self.ttl / 3.0, 0.001)
        first = sent + every
        if time.monotonic() - sent > every:
            try:
                # Bounded by a TTL from now, not by the deadline counted from
                # the acquire's send, which may have passed although the
                # gateway's has not.
                first = self._renew(bound=self.ttl) + every
            except LeaseLost as err:
                with self._cond:
                    self._stopping = True
                    self._lose_locked(err)
                raise
            except Exception as exc:  # noqa: BLE001 - as in _keep_alive: retried until the deadline
                with self._cond:
                    self._last_failure = _renew_failure(exc)
                first = time.monotonic()
        self._renewer = threading.Thread(
            target=self._keep_alive, args=(first,), name=f"fencegw-renew-{self.resource}", daemon=True
        )
        self._watcher = threading.Thread(target=self._watch_deadline, name=f"fencegw-expiry-{self.resource}", daemon=True)
        self._renewer.start()
        self._watcher.start()

    # --- state -------------------------------------------------------------

    @property
    def deadline(self) -> float:
        """When the lease counts as lost unless renewed before, on the
        ``time.monotonic()`` clock: the send time of the last successful
        acquire or renewal, plus the TTL the gateway reported, minus the
        margin. The gateway started its own count later, so the SDK gives up
        first."""
        with self._cond:
            return self._deadline

    @property
    def last_renewed(self) -> float:
        """The ``time.monotonic()`` send time of the last successful acquire
        or renewal."""
        with self._cond:
            return self._last_renewed

    @property
    def error(self) -> Optional[LeaseLost]:
        """Why the lease is lost (None while it is not known to be): the
        gateway's answer (``code`` ``lease_lost``, or a StaleLease), or the
        TTL running out locally (``code`` None)."""
        with self._cond:
            self._due_locked()
            return self._error

    @property
    def lost_at(self) -> Optional[float]:
        """The ``time.monotonic()`` instant the lease was found lost (None
        while it is not). A loss by the TTL running out is never before
        ``deadline``."""
        with self._cond:
            return self._lost_at

    @property
    def released(self) -> bool:
        """Whether the gateway confirmed the release."""
        with self._cond:
            return self._released

    def check(self) -> None:
        """Raises LeaseLost (the cause of the loss) if the lease is known to
        be lost, or a LeaseLost saying so if it was released. Passing says
        nothing about the next write: only the gateway's fence does."""
        with self._cond:
            if self._due_locked():
                assert self._error is not None
                raise self._error
            if self._released:
                raise LeaseLost(f"fencegw: the lease on {self.resource!r} (token {self.token}) was released", op=OP_RELEASE)

    # --- the background ----------------------------------------------------

    def _keep_alive(self, first: float) -> None:
        """Renews every TTL/3, the first time at ``first`` (monotonic), and
        retries failures with backoff, until stopped or lost. Renewals do not
        honour Retry-After: waiting a whole second could cost a short lease."""
        every = max(self.ttl / 3.0, 0.001)
        wait = first - time.monotonic()
        backoff = 0.0
        while True:
            with self._cond:
                if wait > 0:
                    self._cond.wait_for(lambda: self._stopping or self._error is not None, timeout=wait)
                if self._stopping or self._error is not None:
                    return
            try:
                sent = self._renew()
            except LeaseLost as err:
                with self._cond:
                    if not self._stopping:  # else a release or orphan raced the answer: not a loss
                        self._lose_locked(err)
                return
            except Exception as exc:  # noqa: BLE001 - a failed renewal, whatever broke, is retried until the deadline
                failure = _renew_failure(exc)
                with self._cond:
                    if self._stopping:
                        return
                    self._last_failure = failure
                backoff = _next_backoff(backoff, self.ttl)
                wait = backoff
                continue
            backoff = 0.0
            wait = sent + every - time.monotonic()

    def _renew(self, bound: Optional[float] = None) -> float:
        """One renewal, its wait bounded by the local deadline (after it the
        lease counts as lost whatever the answer), or by ``bound`` seconds;
        moves the deadline on success. Returns the renewal's send time."""
        with self._cond:
            rtt = self._rtt
            remaining = self._deadline - time.monotonic() if bound is None else bound
        if remaining <= 0:
            raise FencegwError("fencegw: renew: the deadline passed", op=OP_RENEW)
        sent = time.monotonic()
        try:
            resp = self._client._call(
                "POST",
                f"/v1/leases/{urllib.parse.quote(self.id, safe='')}/renew",
                {"ttl_ms": int(round(self.ttl * 1000))},
                timeout=remaining,
                client_time=_client_time(rtt),
            )
        except TRANSPORT_ERRORS as exc:  # no answer from the gateway
            raise transport_error(OP_RENEW, exc) from exc
        with self._cond:
            self._rtt = time.monotonic() - sent
        if resp.status != 200:
            raise answer_error(OP_RENEW, resp.status, resp.headers, resp.body)
        doc = self._client._json(resp)
        with self._cond:
            # An answer that came after the deadline does not count: the
            # lease was lost then, whatever the gateway says now. Except for
            # the renewal before the lease is handed out (``bound``): its
            # deadline, counted from the acquire's send, may have passed
            # while the gateway's had not.
            live = self._error is None and not self._released if bound is not None else not self._due_locked()
            if live and not self._stopping:
                self._last_failure = None
                self._last_renewed = sent
                d = sent + doc["ttl_ms"] / 1000.0 - self.margin
                if d > self._deadline:
                    self._deadline = d
                    self._cond.notify_all()
        return sent

    def _watch_deadline(self) -> None:
        """Marks the lease lost at its deadline unless a renewal moved it."""
        with self._cond:
            while self._error is None and not self._released:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    self._expire_locked()
                    return
                self._cond.wait(remaining)

    def _expire_locked(self) -> None:
        """Marks the lease lost because its deadline passed."""
        msg = (
            f"fencegw: the lease on {self.resource!r} (token {self.token}) is lost: "
            "its TTL ran out without a successful renewal"
        )
        if self._last_failure is not None:
            msg += f"; last attempt: {self._last_failure}"
        err = LeaseLost(msg, op=OP_RENEW)
        if self._last_failure is not None:
            err.__cause__ = self._last_failure
        self._lose_locked(err)

    def _due_locked(self) -> bool:
        """Whether the deadline has passed; if so the lease is lost now (the
        watcher thread may not have run yet, say right after the process
        was resumed from a freeze)."""
        if self._error is None and not self._released and time.monotonic() >= self._deadline:
            self._expire_locked()
        return self._error is not None

    def _lose(self, err: LeaseLost) -> None:
        with self._cond:
            self._lose_locked(err)

    def _lose_locked(self, err: LeaseLost) -> None:
        """The first cause wins; lost is set once."""
        if self._error is not None or self._released:
            return
        self._error = err
        self._lost_at = time.monotonic()
        self.lost.set()
        self._cond.notify_all()

    def _stop_renewing(self) -> None:
        """Ends the keep-alive. A renewal in flight is not waited for (it
        cannot be cancelled, and may hang until the deadline on a stalled
        gateway); its answer is then ignored."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    # --- fenced writes -----------------------------------------------------

    def request(
        self,
        method: str,
        upstream: str,
        path: str,
        body: Body = None,
        headers: Optional[Mapping[str, str]] = None,
        idempotency_key: Optional[str] = None,
        *,
        attempts: int = 5,
        backoff: float = 0.1,
        timeout: Optional[float] = None,
    ) -> Response:
        """Sends a fenced write to ``upstream`` (a name configured in the
        gateway, ``--upstream statements=...``) through the gateway's
        ``/v1/proxy/{upstream}{path}``. ``path`` (with its query) is sent
        exactly as given: escape it yourself (``/accounts/a%2Fb/lines?x=1``).
        A ``str`` body is sent as UTF-8; set Content-Type in ``headers``.

        Returns the upstream's answer, whatever its status (an upstream's own
        409 is a Response, not an error). Raises, for the gateway's own
        answers: StaleLease (the write did not reach the upstream; the lease
        is now lost: never retried), Unavailable (503, or no answer: then
        whether the write was forwarded is unknown), UpstreamFailed (502/504),
        OutcomeUnknown, or another FencegwError with its code.

        Without ``idempotency_key`` the write is sent once. With one (1 to
        255 printable ASCII characters, one per logical write: see
        ``fencegw.new_idempotency_key()``), it is retried with the same key
        and body while its outcome is open (no answer, 503, 502/504,
        ``idempotency_key_in_progress``), up to ``attempts`` tries, pausing
        ``backoff`` seconds doubling to 2 s, or the gateway's Retry-After; the
        gateway applies a key at most once and answers a retry from its
        record (``Response.replayed``). Refusals and the upstream's own
        answers are never retried.

        The write is sent even if the lease is already known to be lost: the
        gateway decides, and records the refusal where operators see it.
        """
        data: Optional[bytes]
        if isinstance(body, str):
            data = body.encode("utf-8")
        elif body is None:
            data = None
        else:
            data = bytes(body)
        if not path.startswith("/"):
            path = "/" + path
        target = "/v1/proxy/" + urllib.parse.quote(upstream, safe="") + path
        hdrs: Dict[str, str] = dict(headers or {})
        hdrs[HEADER_LEASE] = self.id
        if idempotency_key is not None:
            quoted = idempotency_key.replace("\\", "\\\\").replace('"', '\\"')
            hdrs[HEADER_IDEMPOTENCY_KEY] = f'"{quoted}"'
        else:
            attempts = 1
        pause = backoff
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._write_once(method, target, data, hdrs, timeout)
            except FencegwError as err:
                if attempt >= attempts or not _retryable(err):
                    raise
                wait = err.retry_after if err.retry_after else pause
                pause = min(2 * pause, 2.0)
                time.sleep(wait)

    def _write_once(
        self, method: str, target: str, data: Optional[bytes], headers: Dict[str, str], timeout: Optional[float]
    ) -> Response:
        try:
            resp = self._client._exchange(method, target, data, headers, timeout)
        except TRANSPORT_ERRORS as exc:  # no answer from the gateway
            raise transport_error(OP_WRITE, exc) from exc
        err = gateway_problem(OP_WRITE, resp.status, resp.headers, resp.body)
        if err is None:
            return resp
        if isinstance(err, StaleLease):
            self._lose(err)
        raise err

    # --- the end -----------------------------------------------------------

    def release(self, timeout: Optional[float] = None) -> None:
        """Stops renewing and releases the lease at the gateway, so that the
        resource is free at once. Returns if the gateway released it (now or
        by an earlier call). Raises LeaseLost if the lease had already been
        lost (work done under it may have been refused), Unavailable if the
        gateway did not answer (call again, or let the lease expire after its
        TTL)."""
        self._stop_renewing()
        with self._release_lock:
            with self._cond:
                if self._released:
                    return
                if self._error is not None and self._error.code is not None:
                    raise self._error  # the gateway's word: nothing to release
            try:
                resp = self._client._call(
                    "DELETE", f"/v1/leases/{urllib.parse.quote(self.id, safe='')}", None, timeout=timeout
                )
            except TRANSPORT_ERRORS as exc:  # no answer from the gateway
                raise transport_error(OP_RELEASE, exc) from exc
            if resp.status == 204:
                with self._cond:
                    self._released = True
                    self._cond.notify_all()
                return
            err = answer_error(OP_RELEASE, resp.status, resp.headers, resp.body)
            if isinstance(err, LeaseLost):
                self._lose(err)
            raise err

    def orphan(self) -> None:
        """Stops renewing without releasing: the gateway keeps the lease
        until its TTL runs out, and ``lost`` is set at the deadline."""
        self._stop_renewing()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional["TracebackType"],
    ) -> None:
        """Releases the lease, bounded by the client's close timeout, and
        never raises from it: the block's own exception (if any) propagates
        unchanged; a loss was already signalled through ``lost``; a lease that
        could not be released expires after its TTL. Call ``release()``
        yourself to see its outcome."""
        try:
            self.release(timeout=self._client.close_timeout)
        except LeaseLost as err:
            # Already signalled through lost (or now, by the release's answer).
            log.debug("fencegw: release of %r (token %d) on exit: %s", self.resource, self.token, err)
        except FencegwError as err:
            log.warning("fencegw: release of %r (token %d) on exit: %s", self.resource, self.token, err)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else ("released" if self.released else "held")
        return f"<fencegw.Lease resource={self.resource!r} token={self.token} ttl={self.ttl}s {state}>"


def _renew_failure(exc: Exception) -> FencegwError:
    """A failed renewal as the error recorded for the loss's message."""
    return exc if isinstance(exc, FencegwError) else FencegwError(f"fencegw: renew: {exc!r}", op=OP_RENEW)


def _retryable(err: FencegwError) -> bool:
    """No answer from the gateway, or one that leaves the key's outcome open
    (a retry then learns it from the gateway's record)."""
    if isinstance(err, (StaleLease, LeaseLost)):
        return False
    if err.status == 0 or err.status == 503:
        return isinstance(err, Unavailable)
    if isinstance(err, UpstreamFailed):
        return True
    return isinstance(err, IdempotencyConflict) and err.code == "idempotency_key_in_progress"


def _next_backoff(prev: float, ttl: float) -> float:
    """Doubles from TTL/20 up to TTL/6, with ±20 % jitter so that workers
    that lost the gateway together do not retry in step."""
    lo, hi = max(ttl / 20, 0.005), max(ttl / 6, 0.005)
    d = min(max(2 * prev, lo), hi)
    return d + (random.random() * 0.4 - 0.2) * d


def _client_time(rtt: float) -> str:
    """The Fencing-Client-Time header: the wall clock (for the gateway's
    drift report only; lease time is the gateway's) and the last round trip."""
    now = time.time()
    v = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    if rtt > 0:
        v += f";rtt={rtt * 1000:.1f}"
    return v
