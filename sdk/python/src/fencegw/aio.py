"""The asyncio flavour: the same Client and Lease, their blocking calls run
in the default executor (``asyncio.to_thread``), so that an event loop never
waits on the gateway. Renewal still runs in the Lease's own thread: a loop
blocked by a long synchronous call does not stall it (a frozen process
does)::

    import fencegw.aio

    client = fencegw.aio.Client("http://127.0.0.1:8080", holder="worker-3")
    async with client.lease("stmt:acct:88213", ttl=10, wait=30) as lease:
        resp = await lease.request("POST", "statements", "/accounts/88213/lines", body=b"...")
        lease.check()                      # raises fencegw.LeaseLost once lost
        await lease.wait_lost(timeout=1)   # True once lost
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Generator, Optional, Type

from ._client import Client as _SyncClient
from ._http import Response
from ._lease import Lease as _SyncLease

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Client", "Lease"]


class Lease:
    """An acquired lease (see fencegw.Lease), with awaitable calls."""

    def __init__(self, lease: _SyncLease) -> None:
        self.sync = lease
        """The underlying fencegw.Lease."""

    @property
    def token(self) -> int:
        """The fencing token."""
        return self.sync.token

    @property
    def lost(self) -> threading.Event:
        """Set once the lease is lost (see fencegw.Lease.lost)."""
        return self.sync.lost

    def check(self) -> None:
        """Raises fencegw.LeaseLost if the lease is known to be lost or was released."""
        self.sync.check()

    async def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Waits until the lease is lost; returns whether it is."""
        return await asyncio.to_thread(self.sync.lost.wait, timeout)

    async def request(self, method: str, upstream: str, path: str, **kw: Any) -> Response:
        """fencegw.Lease.request, awaited."""
        return await asyncio.to_thread(self.sync.request, method, upstream, path, **kw)

    async def release(self, timeout: Optional[float] = None) -> None:
        """fencegw.Lease.release, awaited."""
        await asyncio.to_thread(self.sync.release, timeout)

    async def __aenter__(self) -> "Lease":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional["TracebackType"],
    ) -> None:
        """Releases as fencegw.Lease.__exit__ does: never raises from it."""
        await asyncio.to_thread(self.sync.__exit__, exc_type, exc, tb)


class _Acquire:
    """``client.lease(...)``: awaitable (the Lease) and an async context manager."""

    def __init__(self, client: _SyncClient, resource: str, kw: Any) -> None:
        self._client, self._resource, self._kw = client, resource, kw
        self._lease: Optional[Lease] = None

    async def _acquire(self) -> Lease:
        return Lease(await asyncio.to_thread(self._client.lease, self._resource, **self._kw))

    def __await__(self) -> Generator[Any, None, Lease]:
        return self._acquire().__await__()

    async def __aenter__(self) -> Lease:
        self._lease = await self._acquire()
        return self._lease

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional["TracebackType"],
    ) -> None:
        if self._lease is not None:
            await self._lease.__aexit__(exc_type, exc, tb)


class Client:
    """fencegw.Client for asyncio: the same arguments."""

    def __init__(self, base_url: str, holder: Optional[str] = None, api_key: Optional[str] = None, **kw: Any) -> None:
        self.sync = _SyncClient(base_url, holder=holder, api_key=api_key, **kw)
        """The underlying fencegw.Client."""

    def lease(self, resource: str, **kw: Any) -> _Acquire:
        """``async with client.lease(resource, ttl=, wait=) as lease:``, or
        ``lease = await client.lease(...)`` (then ``await lease.release()``)."""
        return _Acquire(self.sync, resource, kw)
