"""fencegw: the Python SDK for workers behind a fencegw gateway.

Acquire a lease and its fencing token, keep it alive in the background,
learn when it is lost, and send writes to a protected upstream through the
gateway so that stale ones are refused before they reach it::

    import fencegw

    client = fencegw.Client("http://127.0.0.1:8080", holder="worker-3")
    with client.lease("stmt:acct:88213", ttl=10, wait=30) as lease:
        lease.check()                      # raises fencegw.LeaseLost once lost
        resp = lease.request("POST", "statements", "/accounts/88213/lines",
                             body=b'{"amount": 5}',
                             headers={"Content-Type": "application/json"},
                             idempotency_key=fencegw.new_idempotency_key())

Holding a Lease does not mean the lease is held: the process can stall past
its TTL between any check and the next write. ``lease.lost`` and
``lease.check()`` stop work early; the gateway's fence (StaleLease) is what
keeps data safe. Only the standard library is used.
"""

from __future__ import annotations

import secrets

from ._client import DEFAULT_CLOSE_TIMEOUT, DEFAULT_TIMEOUT, DEFAULT_TTL, Client
from ._errors import (
    FencegwError,
    IdempotencyConflict,
    InvalidRequest,
    LeaseHeld,
    LeaseLost,
    NotFound,
    OutcomeUnknown,
    RateLimited,
    StaleLease,
    Unauthorized,
    Unavailable,
    UpstreamFailed,
)
from ._http import Response
from ._lease import Lease

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TTL",
    "Client",
    "FencegwError",
    "IdempotencyConflict",
    "InvalidRequest",
    "Lease",
    "LeaseHeld",
    "LeaseLost",
    "NotFound",
    "OutcomeUnknown",
    "RateLimited",
    "Response",
    "StaleLease",
    "Unauthorized",
    "Unavailable",
    "UpstreamFailed",
    "new_idempotency_key",
]

__version__ = "0.1.0"


def new_idempotency_key() -> str:
    """A fresh random idempotency key (128 bits, hex): one per logical
    write, reused for every retry of that write (Lease.request does)."""
    return secrets.token_hex(16)
