"""The shared conformance list (sdk/CONFORMANCE.md), C01-C14, for the Python
SDK, against a real fencegw binary and a real upstream. Each test's name
carries its id. Tests wait on events (the loss signal, an answer); the
timeouts given to those waits only bound a hang."""

from __future__ import annotations

import itertools
import logging
import threading
import time
import unittest
from typing import Any, List
from unittest import mock

import fencegw
from fencegw import _errors

from env import CutProxy, Gateway, Upstream, GatewayTestCase

HANG = 30.0  # bounds a wait that should end on its own much sooner

# Releases that fail on exit are logged as warnings; here they are expected.
logging.getLogger("fencegw").setLevel(logging.ERROR)

_names = itertools.count(1)


def resource(kind: str = "stmt:acct") -> str:
    return f"{kind}:{next(_names)}"


class Base(GatewayTestCase):
    """A real gateway and upstream shared by a class's tests; each test uses
    resources of its own."""

    def client(self, holder: str = "worker-a", url: str = "") -> fencegw.Client:
        return fencegw.Client(url or self.gw.url, holder=holder)

    def lease(self, c: fencegw.Client, name: str, **kw: Any) -> fencegw.Lease:
        lease = c.lease(name, **kw)
        self.addCleanup(lease.__exit__, None, None, None)
        return lease

    def wait_lost(self, lease: fencegw.Lease) -> None:
        self.assertTrue(lease.lost.wait(HANG), "the loss signal never fired")

    def bodies(self) -> List[bytes]:
        return [a["body"] for a in self.up.seen()]


class TestConformance(Base):
    def test_C01_renewal_on_monotonic_clock(self) -> None:
        ttl = 1.0
        name = resource()
        real = time.time
        jumps = itertools.cycle([3600.0, -3600.0, 86400.0])
        # The wall clock jumps back and forth by hours at every reading.
        with mock.patch("time.time", lambda: real() + next(jumps)):
            lease = self.lease(self.client(), name, ttl=ttl)
            end = time.monotonic() + 5 * ttl
            n = 0
            while time.monotonic() < end:
                lease.check()
                r = lease.request("POST", "statements", "/accounts/1/lines", body=f"line {n}")
                self.assertEqual(r.status, 201)
                n += 1
                time.sleep(ttl / 2)
        self.assertFalse(lease.lost.is_set(), lease.error)
        now = time.monotonic()
        self.assertGreater(lease.deadline, now)
        self.assertLessEqual(lease.deadline, now + ttl)
        # Renewed, not re-granted: the same lease, the same token, still held.
        res = self.client().resource(name)
        self.assertTrue(res["held"])
        self.assertEqual(res["token"], lease.token)
        self.assertEqual(res["holder"], "worker-a")

    def test_C02_lost_only_after_a_whole_ttl_without_renewal(self) -> None:
        ttl = 3.0
        proxy = CutProxy(self.gw.url)
        self.addCleanup(proxy.close)
        lease = self.lease(self.client(url=proxy.url), resource(), ttl=ttl)
        # Two failed renewals are retried; the third attempt renews.
        with proxy.lock:
            proxy.fail_renewals = 2
        proxy.wait_renewals(1)
        self.assertEqual(proxy.renewals_failed, 2)
        self.assertFalse(lease.lost.is_set(), "a failed renewal made the lease lost")

        # From now on no renewal reaches the gateway.
        with proxy.lock:
            proxy.fail_renewals = 10**9
            start = time.monotonic()
        self.wait_lost(lease)
        self.assertAlmostEqual(lease.deadline, lease.last_renewed + ttl - lease.margin, places=6)
        self.assertLessEqual(lease.deadline, start + ttl, "the deadline is more than a TTL after renewals stopped")
        lost_at = lease.lost_at
        assert lost_at is not None
        self.assertGreaterEqual(lost_at, lease.deadline, "lost before the deadline")
        err = lease.error
        self.assertIsInstance(err, fencegw.LeaseLost)
        self.assertNotIsInstance(err, fencegw.StaleLease)
        assert err is not None
        self.assertIsNone(err.code)
        self.assertIn("TTL ran out", str(err))
        self.assertGreater(proxy.renewals_failed, 2)

    def test_C03_lost_at_once_on_lease_lost(self) -> None:
        lease = self.lease(self.client(), resource(), ttl=3.0)
        self.gw.revoke(lease.id)
        self.wait_lost(lease)
        err = lease.error
        assert err is not None and lease.lost_at is not None
        self.assertIsInstance(err, fencegw.LeaseLost)
        self.assertEqual((err.code, err.op, err.status), ("lease_lost", "renew", 409))
        self.assertLess(lease.lost_at, lease.deadline, "the loss waited for the deadline, not the answer")

    def test_C04_loss_signal_fires_and_check_raises(self) -> None:
        c = self.client()
        lease = self.lease(c, resource(), ttl=60)
        lease.check()
        self.assertFalse(lease.lost.is_set())
        self.gw.revoke(lease.id)
        with self.assertRaises(fencegw.StaleLease):
            lease.request("POST", "statements", "/x", body="after revoke")
        self.assertTrue(lease.lost.is_set())
        first = lease.error
        with self.assertRaises(fencegw.LeaseLost) as cm:
            lease.check()
        self.assertIs(cm.exception, first)
        self.assertEqual(cm.exception.code, "lease_released")
        with self.assertRaises(fencegw.LeaseLost):  # the gateway's word: nothing to release
            lease.release()
        self.assertTrue(lease.lost.is_set())
        self.assertIs(lease.error, first)

        # A clean release is not a loss.
        other = c.lease(resource(), ttl=60)
        other.release()
        self.assertFalse(other.lost.is_set())
        self.assertTrue(other.released)
        with self.assertRaises(fencegw.LeaseLost):
            other.check()

    def test_C05_stale_write_refused_not_retried(self) -> None:
        name = resource()
        proxy = CutProxy(self.gw.url)
        self.addCleanup(proxy.close)
        a = self.lease(self.client("worker-a", proxy.url), name, ttl=1.0)
        a.orphan()  # A stalls: no more renewals
        self.wait_lost(a)
        b = self.lease(self.client("worker-b"), name, ttl=30, wait=10)
        self.assertEqual(b.token, a.token + 1)
        before = proxy.writes
        with self.assertRaises(fencegw.StaleLease) as cm:
            a.request("POST", "statements", "/accounts/9/lines", body=b"A after the stall",
                      idempotency_key=fencegw.new_idempotency_key(), attempts=5)
        e = cm.exception
        self.assertEqual((e.code, e.status, e.op), ("stale_token", 409, "write"))
        self.assertEqual((e.token, e.current_token), (a.token, b.token))
        self.assertIsInstance(e, fencegw.LeaseLost)
        self.assertEqual(proxy.writes - before, 1, "a stale write was sent again")
        self.assertNotIn(b"A after the stall", self.bodies())
        rej = self.gw.rejections(name)
        self.assertEqual(len(rej), 1)
        self.assertEqual((rej[0]["code"], rej[0]["holder"]), ("stale_token", "worker-a"))
        self.assertEqual(b.request("POST", "statements", "/accounts/9/lines", body=b"B's line").status, 201)

    def test_C06_idempotent_retry_after_cut_connection(self) -> None:
        proxy = CutProxy(self.gw.url)
        self.addCleanup(proxy.close)
        lease = self.lease(self.client(url=proxy.url), resource(), ttl=30)
        key = fencegw.new_idempotency_key()
        with proxy.lock:
            proxy.cut_writes = 1
        r = lease.request("POST", "statements", "/lines", body=b"amount=5",
                          headers={"Content-Type": "text/plain"}, idempotency_key=key, backoff=0.01)
        self.assertEqual((r.status, r.body, r.replayed), (201, b"line added", True))
        self.assertEqual(proxy.writes, 2)
        applied = [a for a in self.up.seen() if a["key"] == f'"{key}"']
        self.assertEqual(len(applied), 1, "the write was applied twice")
        # Two logical writes are two keys, each applied once.
        for _ in range(2):
            r = lease.request("POST", "statements", "/lines", body=b"amount=5", idempotency_key=fencegw.new_idempotency_key())
            self.assertFalse(r.replayed)
        keys = [a["key"] for a in self.up.seen() if a["path"] == "/lines" and a["token"] == lease.token]
        self.assertEqual(len(keys), 3)
        self.assertEqual(len(set(keys)), 3)
        # Without a key, a cut answer is not retried: its outcome is unknown.
        with proxy.lock:
            proxy.cut_writes = 1
        with self.assertRaises(fencegw.Unavailable) as cm:
            lease.request("POST", "statements", "/lines", body=b"no key")
        self.assertEqual(cm.exception.status, 0)
        self.assertFalse(lease.lost.is_set())

    def test_C07_release_on_exit_even_after_exception(self) -> None:
        c = self.client()
        name = resource()
        with self.assertRaises(ZeroDivisionError):
            with c.lease(name, ttl=60) as lease:
                lease.request("POST", "statements", "/x", body=b"work")
                1 / 0
        self.assertTrue(lease.released)
        self.assertFalse(lease.lost.is_set())
        self.assertFalse(c.resource(name)["held"])
        with self.assertRaises(fencegw.StaleLease) as cm:
            lease.request("POST", "statements", "/x", body=b"after exit")
        self.assertEqual(cm.exception.code, "lease_released")
        nxt = self.lease(self.client("worker-b"), name, ttl=60)  # no wait: free at once
        self.assertEqual(nxt.token, lease.token + 1)

    def test_C10_held_resource_is_lease_held(self) -> None:
        name = resource()
        a = self.lease(self.client("worker-a"), name, ttl=60)
        with self.assertRaises(fencegw.LeaseHeld) as cm:
            self.client("worker-b").lease(name, ttl=1)
        e = cm.exception
        self.assertEqual((e.code, e.status, e.holder, e.current_token), ("lease_held", 409, "worker-a", a.token))
        assert e.retry_after is not None
        self.assertGreaterEqual(e.retry_after, 1)
        self.assertTrue(e.expires_at)
        for cls in (fencegw.LeaseLost, fencegw.Unavailable, fencegw.StaleLease):
            self.assertNotIsInstance(e, cls)
        got: List[fencegw.Lease] = []
        t = threading.Thread(target=lambda: got.append(self.client("worker-b").lease(name, ttl=60, wait=20)))
        t.start()
        a.release()
        t.join(HANG)
        self.assertEqual(len(got), 1)
        self.addCleanup(got[0].release)
        self.assertEqual(got[0].token, a.token + 1)

    def test_C11_upstream_answers_pass_through(self) -> None:
        lease = self.lease(self.client(), resource(), ttl=60)
        r = lease.request("POST", "statements", "/conflict", body=b"x")
        self.assertEqual((r.status, r.body), (409, Upstream.PROBLEM))
        self.assertEqual(r.headers["Content-Type"], "application/problem+json")
        self.assertFalse(lease.lost.is_set())
        with self.assertRaises(fencegw.NotFound) as nf:
            lease.request("PUT", "nowhere", "/x")
        self.assertEqual(nf.exception.code, "unknown_upstream")
        with self.assertRaises(fencegw.UpstreamFailed) as uf:
            lease.request("PUT", "dead", "/x")
        self.assertEqual((uf.exception.code, uf.exception.status), ("upstream_unreachable", 502))
        self.assertFalse(lease.lost.is_set())

    def test_C12_paths_pass_through_untouched(self) -> None:
        name = resource("inventory") + "/SKU-001"
        c = self.client()
        lease = self.lease(c, name, ttl=60)
        r = lease.request("POST", "statements", "/accounts/a%2Fb/lines?x=1&y=%20", body=b"sku,qty\n1,2\n",
                          headers={"Content-Type": "text/csv; charset=utf-8"})
        self.assertEqual(r.status, 201)
        last = self.up.seen()[-1]
        self.assertEqual(last["path"], "/accounts/a%2Fb/lines?x=1&y=%20")
        self.assertEqual((last["method"], last["body"], last["content_type"]), ("POST", b"sku,qty\n1,2\n", "text/csv; charset=utf-8"))
        self.assertEqual(last["token"], lease.token)
        self.assertFalse(last["had_lease"], "Fencing-Lease reached the upstream")
        res = c.resource(name)  # GET /v1/resources/inventory%3A...%2FSKU-001
        self.assertEqual((res["resource"], res["token"]), (name, lease.token))

    def test_C13_unknown_codes_carried_as_data(self) -> None:
        doc = {"type": "urn:fencegw:problem:brand_new", "title": "New", "status": 418, "code": "brand_new", "extra": [1]}
        body = __import__("json").dumps(doc).encode()
        err = _errors.gateway_problem("write", 418, {"Content-Type": "application/problem+json"}, body)
        assert err is not None
        self.assertIs(type(err), fencegw.FencegwError)
        self.assertEqual((err.code, err.status, err.problem), ("brand_new", 418, doc))
        doc503 = dict(doc, status=503, code="brand_new_503")
        err = _errors.gateway_problem("write", 503, {"Content-Type": "application/problem+json", "Retry-After": "2"},
                                      __import__("json").dumps(doc503).encode())
        self.assertIsInstance(err, fencegw.Unavailable)
        assert err is not None
        self.assertEqual((err.code, err.retry_after), ("brand_new_503", 2.0))
        # An upstream's own problem document is not the gateway's.
        self.assertIsNone(_errors.gateway_problem("write", 409, {"Content-Type": "application/problem+json"}, Upstream.PROBLEM))

    def test_C14_acquire_that_waited_longer_than_its_ttl_hands_out_a_live_lease(self) -> None:
        name = resource()
        ttl = 0.6
        a = self.lease(self.client("worker-a"), name, ttl=60)
        released: List[BaseException] = []

        def release_later() -> None:
            time.sleep(3 * ttl)  # B waits this long: several of its TTLs
            try:
                a.release()
            except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
                released.append(exc)

        t = threading.Thread(target=release_later)
        before = time.monotonic()
        t.start()
        b = self.lease(self.client("worker-b"), name, ttl=ttl, wait=10)
        t.join(HANG)
        self.assertEqual(released, [])
        self.assertGreater(time.monotonic() - before, ttl, "B's acquire did not wait past its TTL: the test proves nothing")
        self.assertEqual(b.token, a.token + 1)
        # Counted from a renewal made after the wait, not from the acquire's send.
        self.assertFalse(b.lost.is_set(), f"B's lease, just granted, counted as lost: {b.error}")
        b.check()
        self.assertGreater(b.last_renewed, before + ttl)
        r = b.request("POST", "statements", "/c14", body=b"B")
        self.assertEqual(r.status, 201)
        # And it is renewed from there on: two TTLs' worth of renewals.
        until = b.last_renewed + 2 * ttl
        while b.last_renewed < until:
            self.assertFalse(b.lost.wait(ttl / 10), f"B's lease lost while renewing: {b.error}")
            self.assertLess(time.monotonic(), until + HANG, "B's lease was not renewed")
        b.check()
        r = b.request("POST", "statements", "/c14", body=b"B again")
        self.assertEqual(r.status, 201)
        self.assertEqual([x["token"] for x in self.up.seen() if x["path"] == "/c14"], [b.token, b.token])


class TestGatewayDown(Base):
    """C08 and C09 stop the gateway: each test has a gateway of its own."""

    def setUp(self) -> None:
        self.gw = Gateway(self.up.url)
        self.addCleanup(self.gw.close)

    @classmethod
    def setUpClass(cls) -> None:
        cls.up = Upstream()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.up.close()

    def test_C08_gateway_down_is_unavailable_not_lost(self) -> None:
        c = self.client()
        lease = self.lease(c, resource(), ttl=2.0)
        self.gw.kill()
        with self.assertRaises(fencegw.Unavailable) as cm:
            c.lease(resource(), ttl=2.0)
        self.assertEqual(cm.exception.status, 0)
        with self.assertRaises(fencegw.Unavailable) as cm:
            lease.request("POST", "statements", "/x", body=b"while down")
        self.assertNotIsInstance(cm.exception, fencegw.LeaseLost)
        # Not lost by the failures: only by the deadline.
        self.wait_lost(lease)
        lost_at = lease.lost_at
        assert lost_at is not None and lease.error is not None
        self.assertGreaterEqual(lost_at, lease.deadline)
        self.assertIsNone(lease.error.code)
        self.assertNotIsInstance(lease.error, fencegw.StaleLease)
        with self.assertRaises(fencegw.Unavailable):
            lease.release()
        with self.assertRaises(fencegw.Unavailable):
            fencegw.Client(self.gw.url).resource("x")

    def test_C09_gateway_paused_longer_than_ttl(self) -> None:
        c = self.client()
        name = resource()
        # A pause shorter than the TTL minus the margin loses nothing.
        lease = self.lease(c, name, ttl=6.0)
        self.gw.pause()
        time.sleep(0.5)
        self.gw.resume()
        resumed = time.monotonic()
        end = time.monotonic() + HANG
        while lease.last_renewed < resumed and time.monotonic() < end and not lease.lost.is_set():
            time.sleep(0.05)
        self.assertFalse(lease.lost.is_set(), lease.error)
        self.assertGreaterEqual(lease.last_renewed, resumed)
        lease.release()

        ttl = 1.5
        lease = self.lease(c, name, ttl=ttl)
        self.gw.pause()
        self.addCleanup(self.gw.resume)
        start = time.monotonic()
        self.wait_lost(lease)  # no answer can have come: the loss is the SDK's own
        self.assertLessEqual(lease.deadline, start + ttl)
        lost_at = lease.lost_at
        assert lost_at is not None and lease.error is not None
        self.assertGreaterEqual(lost_at, lease.deadline)
        self.assertIsNone(lease.error.code)
        # Paused for longer than the TTL: the gateway's own count, which
        # started after ours, has run out too when it wakes.
        time.sleep(max(start + ttl + 0.5 - time.monotonic(), 0))
        self.gw.resume()
        with self.assertRaises(fencegw.StaleLease) as cm:
            lease.request("POST", "statements", "/x", body=b"after the pause")
        self.assertIn(cm.exception.code, ("lease_expired", "stale_token"))
        self.assertNotIn(b"after the pause", [a["body"] for a in self.up.seen()])
        nxt = self.lease(self.client("worker-b"), name, ttl=30, wait=10)
        self.assertEqual(nxt.token, lease.token + 1)


if __name__ == "__main__":
    unittest.main()
