"""The SDK's exceptions: one class per family of the gateway's problem codes,
and the parsing of the gateway's application/problem+json answers into them.

Every exception is a FencegwError with ``.code`` (the problem's code, or None
when there was no gateway answer) and ``.problem`` (the whole problem
document as a dict; empty without one). A code this SDK does not know still
becomes a FencegwError carrying it, so a newer gateway's codes can be matched
by string.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import time
from typing import Any, Dict, Mapping, Optional, Type, Union

#: Headers as a mapping, or http.client's message (case-insensitive).
Headers = Union[Mapping[str, str], http.client.HTTPMessage]

# Operations named in FencegwError.op.
OP_ACQUIRE = "acquire"
OP_RENEW = "renew"
OP_RELEASE = "release"
OP_WRITE = "write"

# The `type` of every problem the gateway itself writes starts with this; an
# upstream's own problem documents do not.
PROBLEM_TYPE_PREFIX = "urn:fencegw:problem:"

# How much of a problem body is read to decide whether the gateway wrote it.
MAX_PROBLEM_BODY = 64 << 10

STALE_CODES = frozenset({"stale_token", "lease_expired", "lease_released", "unknown_lease"})


class FencegwError(Exception):
    """A problem answer of the gateway, or the failure to get any answer.

    Attributes:
        code: the problem's code (``"stale_token"``, ...), or None if the
            gateway did not answer (then ``status`` is 0) or the answer was not
            one of its problem documents.
        problem: the problem document as a dict (empty without one).
        status: the HTTP status; 0 if the gateway did not answer.
        op: ``"acquire"``, ``"renew"``, ``"release"`` or ``"write"``.
        retry_after: seconds from the answer's Retry-After, or None.
    """

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: int = 0,
        op: str = "",
        problem: Optional[Dict[str, Any]] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.op = op
        self.problem: Dict[str, Any] = dict(problem or {})
        self.retry_after = retry_after

    # The problem's facts, where they apply.
    @property
    def detail(self) -> Optional[str]:
        """The problem's human-readable detail."""
        return self.problem.get("detail")

    @property
    def field(self) -> Optional[str]:
        """invalid_request: the offending field."""
        return self.problem.get("field")

    @property
    def resource(self) -> Optional[str]:
        """The resource the problem is about."""
        return self.problem.get("resource")

    @property
    def token(self) -> Optional[int]:
        """The token the refused write or lease carried."""
        return self.problem.get("token")

    @property
    def current_token(self) -> Optional[int]:
        """The resource's current token."""
        return self.problem.get("current_token")

    @property
    def holder(self) -> Optional[str]:
        """The holder of the resource's current lease."""
        return self.problem.get("holder")


class LeaseLost(FencegwError):
    """The lease is no longer held: the gateway said so (``lease_lost``, or
    ``not_found`` on renew or release), a write under it was refused as stale
    (see StaleLease, a subclass), or its TTL ran out on the local monotonic
    clock without a successful renewal (then ``code`` is None and ``status``
    0)."""


class StaleLease(LeaseLost):
    """The gateway refused a fenced write because its lease is not the
    resource's current one (``stale_token``, ``lease_expired``,
    ``lease_released``, ``unknown_lease``). The write did not reach the
    upstream, the gateway recorded the refusal, and the lease is lost. Never
    retried."""


class LeaseHeld(FencegwError):
    """Acquire found the resource held by another lease (``lease_held``):
    ``holder``, ``current_token``, ``expires_at`` and ``retry_after`` say by
    whom and for how long."""

    @property
    def expires_at(self) -> Optional[str]:
        """When the holder's lease expires unless renewed (RFC 3339)."""
        return self.problem.get("expires_at")


class Unavailable(FencegwError):
    """The gateway could not serve the call: a 503 (``store_unavailable``,
    ``fence_busy``, ``fence_lost``; see ``retry_after``), or no answer at all
    (connection refused, cut, timed out: ``status`` 0). A gateway that is down
    is unavailable, not a lost lease: a held lease is lost only when its TTL
    runs out without a renewal. A gateway that answered 503 granted or
    forwarded nothing; without an answer, whether a write was forwarded is
    unknown (use an idempotency key)."""


class UpstreamFailed(FencegwError):
    """The gateway admitted a fenced write but got no answer from the
    upstream (``upstream_unreachable`` 502, ``upstream_timeout`` 504). After a
    timeout the write may still land."""


class OutcomeUnknown(FencegwError):
    """A write with an idempotency key was forwarded once and its outcome is
    unknown (``idempotency_outcome_unknown``); the gateway never forwards that
    key again. It may have been applied: read the upstream's state."""


class IdempotencyConflict(FencegwError):
    """The idempotency key is in use: its first write is still in flight
    (``idempotency_key_in_progress``, retried by Lease.request), or it was
    first used for another request (``idempotency_key_mismatch``, 422)."""


class InvalidRequest(FencegwError):
    """The call was malformed (``invalid_request`` with ``field``,
    ``missing_lease``, ``body_too_large``, ``unsupported_media_type``,
    ``request_timeout``)."""


class Unauthorized(FencegwError):
    """No API key, or a wrong one (401), or the key may not do this (403
    ``forbidden``, ``lease_not_owned``, ``resource_mismatch``)."""


class NotFound(FencegwError):
    """No such lease, resource, endpoint (``not_found``) or upstream
    (``unknown_upstream``)."""


class RateLimited(FencegwError):
    """The API key is over its request rate or lease cap (429
    ``rate_limited``, ``too_many_leases``); see ``retry_after``."""


_BY_CODE: Dict[str, Type[FencegwError]] = {
    "stale_token": StaleLease,
    "lease_expired": StaleLease,
    "lease_released": StaleLease,
    "unknown_lease": StaleLease,
    "lease_lost": LeaseLost,
    "lease_held": LeaseHeld,
    "store_unavailable": Unavailable,
    "fence_busy": Unavailable,
    "fence_lost": Unavailable,
    "shutting_down": Unavailable,
    "upstream_unreachable": UpstreamFailed,
    "upstream_timeout": UpstreamFailed,
    "idempotency_outcome_unknown": OutcomeUnknown,
    "idempotency_key_in_progress": IdempotencyConflict,
    "idempotency_key_mismatch": IdempotencyConflict,
    "invalid_request": InvalidRequest,
    "missing_lease": InvalidRequest,
    "body_too_large": InvalidRequest,
    "unsupported_media_type": InvalidRequest,
    "request_timeout": InvalidRequest,
    "unauthorized": Unauthorized,
    "forbidden": Unauthorized,
    "lease_not_owned": Unauthorized,
    "resource_mismatch": Unauthorized,
    "not_found": NotFound,
    "unknown_upstream": NotFound,
    "rate_limited": RateLimited,
    "too_many_leases": RateLimited,
}


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Retry-After in seconds (delta-seconds or an HTTP date); None if absent
    or unparsable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def is_problem_content_type(content_type: Optional[str]) -> bool:
    """Whether a Content-Type declares application/problem+json."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "application/problem+json"


def gateway_problem(
    op: str, status: int, headers: Headers, body: bytes
) -> Optional[FencegwError]:
    """The exception for an answer if it is a problem document the gateway
    itself wrote (problem+json whose type starts urn:fencegw:problem:); None
    for anything else, such as an upstream's own 409."""
    if status < 400 or not is_problem_content_type(headers.get("Content-Type")):
        return None
    if len(body) > MAX_PROBLEM_BODY:
        return None
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or not str(doc.get("type", "")).startswith(PROBLEM_TYPE_PREFIX):
        return None
    code = doc.get("code") or str(doc["type"])[len(PROBLEM_TYPE_PREFIX):]
    return problem_error(op, status, code, doc, parse_retry_after(headers.get("Retry-After")))


def problem_error(
    op: str,
    status: int,
    code: Optional[str],
    doc: Dict[str, Any],
    retry_after: Optional[float],
) -> FencegwError:
    """The exception of the family of code (by status if code is unknown)."""
    cls: Type[FencegwError] = FencegwError
    if code in _BY_CODE:
        cls = _BY_CODE[code]
    elif code == "not_found" or status == 404:
        cls = NotFound
    elif status == 503:
        cls = Unavailable
    if code == "not_found" and op in (OP_RENEW, OP_RELEASE):
        cls = LeaseLost  # the gateway no longer knows the lease
    if status == 503:
        cls = Unavailable
    parts = [f"fencegw: {op}: {status}"]
    if code:
        parts.append(f" {code}")
    text = doc.get("detail") or doc.get("title")
    if text:
        parts.append(f": {text}")
    return cls("".join(parts), code=code, status=status, op=op, problem=doc, retry_after=retry_after)


def answer_error(op: str, status: int, headers: Headers, body: bytes) -> FencegwError:
    """The exception for a control call's unexpected answer: the gateway's
    problem if it is one, else a bare status (a 502/503/504 from something in
    front of the gateway is Unavailable)."""
    err = gateway_problem(op, status, headers, body)
    if err is not None:
        return err
    cls: Type[FencegwError] = Unavailable if status in (502, 503, 504) else FencegwError
    return cls(
        f"fencegw: {op}: {status} (not a gateway problem answer)",
        status=status,
        op=op,
        retry_after=parse_retry_after(headers.get("Retry-After")),
    )


def transport_error(op: str, exc: BaseException) -> Unavailable:
    """The exception for a call that got no answer from the gateway."""
    err = Unavailable(f"fencegw: {op}: gateway unreachable: {exc}", op=op)
    err.__cause__ = exc
    return err
