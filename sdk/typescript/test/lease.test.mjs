// Conformance (sdk/CONFORMANCE.md) of the lease's life against the real
// gateway: renewal (C01), loss after a whole TTL without renewal (C02), loss
// at once on lease_lost (C03), the signal (C04), a gateway that is down (C08).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Client, LeaseLostError, StaleLeaseError, UnavailableError } from "../dist/index.js";
import { startGateway, startUpstream, startProxy, closedUrl, until, aborted, resource } from "./harness.mjs";

let up, gw, proxy;
before(async () => {
  up = await startUpstream();
  gw = await startGateway(up.url);
  proxy = await startProxy(gw.url);
});
after(async () => {
  await proxy?.close();
  await gw?.stop();
  await up?.close();
});

/** A client whose calls go through the fault proxy, with the fault for renewals of this test set by fault(). */
function viaProxy(holder, fault = () => "pass") {
  proxy.fault = fault;
  return new Client(proxy.url, { holder });
}

test("C01 renewal on a monotonic clock keeps the lease", async () => {
  const ttlMs = 1500;
  const c = viaProxy("c01");
  const res = resource("c01");
  const realNow = Date.now;
  const sent = performance.now();
  const lease = await c.acquire(res, { ttlMs });
  const renewalsBefore = proxy.renewals().length;
  // The wall clock jumps an hour ahead: nothing about the lease may notice.
  Date.now = () => realNow() + 3_600_000;
  try {
    for (let i = 0; i < 5; i++) {
      // Wait for the next renewal, then write.
      const n = proxy.renewals().length;
      await until(() => proxy.renewals().length > n, "a renewal");
      const r = await lease.request("PUT", "inventory", `/stock/c01?i=${i}`, { body: String(i) });
      assert.equal(r.status, 201);
      await r.arrayBuffer();
      const now = performance.now();
      assert.ok(lease.deadline > now && lease.deadline <= now + ttlMs, `deadline ${lease.deadline - now} ms from now`);
      assert.equal(lease.signal.aborted, false);
    }
  } finally {
    Date.now = realNow;
  }
  // Renewal n was sent no earlier than n TTL/3 after the acquire was sent.
  const renewals = proxy.renewals().slice(renewalsBefore);
  assert.ok(renewals.length >= 5);
  renewals.forEach((r, i) => assert.ok(r.at >= sent + ((i + 1) * ttlMs) / 3 - 1, `renewal ${i + 1} at ${r.at - sent} ms`));
  assert.equal(up.at("/stock/c01").length, 5);
  assert.ok(up.at("/stock/c01").every((a) => a.token === String(lease.token)));
  await lease.release();
  assert.equal(lease.signal.aborted, false, "a clean release is not a loss");
});

test("C02 lost only after a whole TTL without a successful renewal", async () => {
  const ttlMs = 900;
  // No renewal gets an answer: the first two are refused, the rest hang.
  let k = 0;
  const c = viaProxy("c02", (req) => (req.url.endsWith("/renew") ? (k++ < 2 ? "refuse" : "hang") : "pass"));
  const n = proxy.renewals().length;
  const sent = performance.now();
  const lease = await c.acquire(resource("c02"), { ttlMs });
  const answered = performance.now();
  const deadline = lease.deadline;
  // The acquire is the last success: its send time plus the TTL, minus the margin.
  assert.ok(deadline >= sent + ttlMs - ttlMs / 10 && deadline <= answered + ttlMs, "the deadline is within one TTL of the acquire");
  const lostAt = await aborted(lease.signal);
  assert.ok(lostAt >= deadline, `lost ${deadline - lostAt} ms before the deadline`);
  assert.equal(lease.deadline, deadline, "failed renewals never moved the deadline");
  const failed = proxy.renewals().slice(n);
  assert.ok(failed.length >= 3, `renewals were retried (${failed.length} attempts)`);
  const why = lease.signal.reason;
  assert.ok(why instanceof LeaseLostError && !(why instanceof StaleLeaseError), String(why));
  assert.equal(why.code, "");
  assert.match(why.message, /TTL ran out/);
  assert.throws(() => lease.check(), LeaseLostError);
  await lease.release().catch(() => {});
});

test("C02 a failed renewal is retried and does not lose the lease", async () => {
  const ttlMs = 1200;
  let failures = 0;
  const c = viaProxy("c02b", (req) => (req.url.endsWith("/renew") && failures < 2 ? (failures++, "refuse") : "pass"));
  const lease = await c.acquire(resource("c02b"), { ttlMs });
  const first = lease.deadline;
  await until(() => lease.deadline > first, "a renewal after two failed ones");
  assert.equal(failures, 2);
  assert.equal(lease.signal.aborted, false);
  lease.check();
  await lease.release();
});

test("C03 lost at once on the gateway's lease_lost", async () => {
  const c = viaProxy("c03");
  const lease = await c.acquire(resource("c03"), { ttlMs: 3000 });
  const deadline = lease.deadline;
  await gw.revoke(lease.id);
  const lostAt = await aborted(lease.signal);
  assert.ok(lostAt < deadline, "lost before its deadline");
  const why = lease.signal.reason;
  assert.ok(why instanceof LeaseLostError && !(why instanceof StaleLeaseError));
  assert.equal(why.code, "lease_lost");
  assert.equal(why.op, "renew");
  assert.equal(why.status, 409);
  await assert.rejects(lease.release(), (e) => e === why);
});

test("C04 the loss signal fires once, aborts in-flight fetches, and checking throws", async () => {
  const c = viaProxy("c04");
  const lease = await c.acquire(resource("c04"), { ttlMs: 3000 });
  lease.check();
  assert.equal(lease.lost, false);
  assert.equal(lease.error, undefined);
  let fired = 0;
  lease.signal.addEventListener("abort", () => fired++);
  // A fenced write and the worker's own fetch, both in flight at the loss.
  const write = lease.request("POST", "inventory", "/hang/c04", { body: "x" });
  const own = fetch(`${up.url}/hang/own`, { signal: lease.signal });
  await until(() => up.at("/hang/").length >= 2, "both requests at the upstream");
  await gw.revoke(lease.id);
  await assert.rejects(write, (e) => e instanceof LeaseLostError && e.op === "write" && e.code === "lease_lost");
  await assert.rejects(own, (e) => e instanceof LeaseLostError);
  assert.equal(fired, 1);
  assert.ok(lease.lost);
  assert.ok(lease.error instanceof LeaseLostError);
  assert.throws(() => lease.check(), (e) => e === lease.signal.reason);
  // A later refusal does not fire it again, nor change its reason.
  const reason = lease.signal.reason;
  await assert.rejects(lease.request("POST", "inventory", "/stock/c04", { body: "y" }), StaleLeaseError);
  assert.equal(fired, 1);
  assert.equal(lease.signal.reason, reason);
});

test("C04 a clean release is not a loss", async () => {
  const c = viaProxy("c04b");
  let signal;
  await c.using(resource("c04b"), { ttlMs: 2000 }, async (lease, s) => {
    signal = s;
    assert.equal(s, lease.signal);
  });
  assert.equal(signal.aborted, false);
});

test("C08 a gateway that is down is unavailable, not lost", async () => {
  const nowhere = new Client(await closedUrl(), { holder: "c08" });
  await assert.rejects(nowhere.acquire(resource("c08"), { ttlMs: 1000 }), (e) => e instanceof UnavailableError && e.status === 0 && !(e instanceof LeaseLostError));

  let down = false;
  const c = viaProxy("c08", () => (down ? "refuse" : "pass"));
  const lease = await c.acquire(resource("c08"), { ttlMs: 3000 });
  const deadline = lease.deadline;
  down = true;
  const n = proxy.renewals().length;
  await until(() => proxy.renewals().length >= n + 2, "two refused renewals");
  await assert.rejects(lease.request("POST", "inventory", "/stock/c08", { body: "1" }), (e) => e instanceof UnavailableError && e.status === 0);
  await assert.rejects(lease.release(), (e) => e instanceof UnavailableError && !(e instanceof LeaseLostError));
  assert.ok(performance.now() < deadline || lease.signal.aborted, "the test outlived the deadline");
  assert.equal(lease.signal.aborted, false, "not lost before its deadline");
  // The gateway is back: release works, and the lease had never been lost.
  down = false;
  await lease.release();
  assert.equal(lease.signal.aborted, false);
  assert.equal(up.at("/stock/c08").length, 0);
});
