"""fencegw.aio against a real gateway: acquire, write, release on exit after
an exception, and the loss awaited."""

from __future__ import annotations

import asyncio
import unittest

import fencegw
import fencegw.aio

from env import GatewayTestCase


class TestAio(GatewayTestCase):
    def test_aio_lease_write_release_and_loss(self) -> None:
        async def main() -> None:
            client = fencegw.aio.Client(self.gw.url, holder="aio")
            with self.assertRaises(KeyError):
                async with client.lease("stmt:acct:aio-1", ttl=30) as lease:
                    r = await lease.request("POST", "statements", "/accounts/aio-1/lines", body=b"x")
                    self.assertEqual(r.status, 201)
                    raise KeyError("boom")
            self.assertTrue(lease.sync.released)
            self.assertFalse(client.sync.resource("stmt:acct:aio-1")["held"])

            lease = await client.lease("stmt:acct:aio-2", ttl=1)
            lease.sync.orphan()
            self.assertTrue(await lease.wait_lost(30))
            async with fencegw.aio.Client(self.gw.url, holder="aio-b").lease("stmt:acct:aio-2", ttl=30, wait=10) as b:
                self.assertEqual(b.token, lease.token + 1)
                with self.assertRaises(fencegw.StaleLease) as cm:
                    await lease.request("POST", "statements", "/accounts/aio-2/lines", body=b"late")
                self.assertEqual(cm.exception.code, "stale_token")
            with self.assertRaises(fencegw.LeaseLost):
                lease.check()

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
