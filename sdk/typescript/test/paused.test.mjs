// Conformance (sdk/CONFORMANCE.md) C09: the real gateway process paused
// with SIGSTOP for longer than the TTL, and for less.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Client, LeaseLostError, StaleLeaseError } from "../dist/index.js";
import { startGateway, startUpstream, until, aborted, resource } from "./harness.mjs";

let up, gw;
before(async () => {
  up = await startUpstream();
  gw = await startGateway(up.url);
});
after(async () => {
  await gw?.stop();
  await up?.close();
});

test("C09 a gateway paused (SIGSTOP) longer than the TTL", async () => {
  const res = resource("c09");
  const c = new Client(gw.url, { holder: "c09" });
  const ttlMs = 800;
  const lease = await c.acquire(res, { ttlMs });
  const granted = performance.now(); // the gateway granted it before this
  gw.pause();
  try {
    const deadline = lease.deadline;
    const lostAt = await aborted(lease.signal);
    assert.ok(lostAt >= deadline, `lost ${deadline - lostAt} ms before its deadline`);
    assert.equal(lease.deadline, deadline);
    // The pause lasts longer than the TTL as the gateway counts it, from
    // its grant (the SDK counts from the acquire's send, earlier: it gave
    // up first).
    await until(() => performance.now() > granted + ttlMs + 50, "the end of the pause");
  } finally {
    gw.resume();
  }
  const why = lease.signal.reason;
  assert.ok(why instanceof LeaseLostError && !(why instanceof StaleLeaseError), String(why));
  assert.equal(why.code, "");
  // The lease is gone at the gateway too.
  const err = await lease.request("PUT", "inventory", "/stock/c09", { body: "1" }).catch((e) => e);
  assert.ok(err instanceof StaleLeaseError, String(err));
  assert.equal(up.at("/stock/c09").length, 0);
  const next = await c.acquire(res, { ttlMs });
  assert.equal(next.token, lease.token + 1);
  await next.release();
});

test("C09 a pause shorter than the TTL minus the margin loses nothing", async () => {
  const c = new Client(gw.url, { holder: "c09b" });
  const lease = await c.acquire(resource("c09b"), { ttlMs: 3000 });
  gw.pause();
  await new Promise((r) => setTimeout(r, 500)); // the pause being tested, not a wait for an event
  gw.resume();
  const after = lease.deadline;
  await until(() => lease.deadline > after, "a renewal after the pause");
  assert.equal(lease.signal.aborted, false);
  const r = await lease.request("PUT", "inventory", "/stock/c09b", { body: "1" });
  assert.equal(r.status, 201);
  await r.arrayBuffer();
  await lease.release();
});
