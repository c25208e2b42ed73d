// Conformance (sdk/CONFORMANCE.md) of fenced writes and scopes against the
// real gateway: stale writes (C05), idempotent retries (C06), release on
// exit (C07), held resources (C10), the upstream's answers (C11), paths
// (C12), unknown codes (C13), an acquire that waited past its TTL (C14).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import {
  Client,
  FencegwError,
  LeaseHeldError,
  LeaseLostError,
  StaleLeaseError,
  UnavailableError,
  UpstreamError,
  newIdempotencyKey,
  replayed,
} from "../dist/index.js";
import { errorFor, parseProblem } from "../dist/errors.js";
import { startGateway, startUpstream, startProxy, resource } from "./harness.mjs";

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

test("C05 stale write refused, raised as stale, never retried", async () => {
  const res = resource("c05");
  // Pod A stalls: its renewals never get an answer, as a frozen process's would not.
  proxy.fault = (req) => (req.url.endsWith("/renew") ? "hang" : "pass");
  const a = await new Client(proxy.url, { holder: "pod-a" }).acquire(res, { ttlMs: 600 });
  const b = new Client(gw.url, { holder: "pod-b" });
  const lb = await b.acquire(res, { ttlMs: 5000, waitMs: 10_000 });
  assert.equal(lb.token, a.token + 1);
  const wrote = await lb.request("PUT", "inventory", `/stock/${encodeURIComponent(res)}`, { body: "7" });
  assert.equal(wrote.status, 201);
  await wrote.arrayBuffer();

  const before = proxy.seen.filter((s) => s.path.startsWith("/v1/proxy/")).length;
  const err = await a
    .request("PUT", "inventory", `/stock/${encodeURIComponent(res)}`, { body: "10", idempotencyKey: newIdempotencyKey() })
    .then(() => assert.fail("the stale write was accepted"), (e) => e);
  assert.ok(err instanceof StaleLeaseError && err instanceof LeaseLostError, String(err));
  assert.ok(["stale_token", "lease_expired"].includes(err.code), err.code);
  assert.equal(err.status, 409);
  assert.equal(err.op, "write");
  if (err.code === "stale_token") {
    assert.equal(err.token, a.token);
    assert.equal(err.currentToken, lb.token);
  }
  assert.equal(proxy.seen.filter((s) => s.path.startsWith("/v1/proxy/")).length, before + 1, "sent exactly once");
  assert.deepEqual(up.at(`/stock/${encodeURIComponent(res)}`).map((x) => x.body), ["7"], "the stale write never reached the upstream");
  assert.ok(a.signal.aborted, "the lease is lost");
  assert.ok(a.signal.reason instanceof LeaseLostError);
  await lb.release();
});

test("C05 a refused write marks the lease lost at once", async () => {
  const res = resource("c05b");
  const c = new Client(gw.url, { holder: "c05b" });
  const lease = await c.acquire(res, { ttlMs: 5000 });
  await gw.revoke(lease.id);
  // Before the next renewal could tell it, the refused write does.
  const err = await lease.request("POST", "inventory", "/stock/c05b", { body: "1" }).catch((e) => e);
  assert.ok(err instanceof StaleLeaseError, String(err));
  assert.equal(err.code, "lease_released");
  assert.ok(lease.signal.aborted);
  assert.equal(lease.signal.reason, err);
});

test("C06 idempotent retry after a cut connection is replayed, not applied twice", async () => {
  const res = resource("c06");
  let cuts = 1;
  proxy.fault = (req) => (req.url.startsWith("/v1/proxy/") && cuts > 0 ? (cuts--, "cut") : "pass");
  const lease = await new Client(proxy.url, { holder: "c06" }).acquire(res, { ttlMs: 5000 });
  const key = newIdempotencyKey();
  const r = await lease.request("POST", "inventory", "/lines/c06", { body: "amount=5", idempotencyKey: key });
  assert.equal(r.status, 201);
  assert.ok(replayed(r), "answered from the gateway's record of the first attempt");
  const first = JSON.parse(await r.text());
  assert.equal(first.body, "amount=5");
  const attempts = proxy.seen.filter((s) => s.path === "/v1/proxy/inventory/lines/c06");
  assert.deepEqual(attempts.map((s) => s.fault), ["cut", "pass"]);
  let applied = up.at("/lines/c06");
  assert.equal(applied.length, 1, "applied once");
  assert.equal(applied[0].key, `"${key}"`);
  // Two logical writes are two keys.
  const r2 = await lease.request("POST", "inventory", "/lines/c06", { body: "amount=5", idempotencyKey: newIdempotencyKey() });
  assert.equal(r2.status, 201);
  assert.equal(replayed(r2), false);
  await r2.arrayBuffer();
  applied = up.at("/lines/c06");
  assert.equal(applied.length, 2);
  assert.notEqual(applied[0].key, applied[1].key);
  await lease.release();
});

test("C06 without a key a cut connection is not retried", async () => {
  const res = resource("c06b");
  let cuts = 1;
  proxy.fault = (req) => (req.url.startsWith("/v1/proxy/") && cuts > 0 ? (cuts--, "cut") : "pass");
  const lease = await new Client(proxy.url, { holder: "c06b" }).acquire(res, { ttlMs: 5000 });
  await assert.rejects(lease.request("POST", "inventory", "/lines/c06b", { body: "x" }), (e) => e instanceof UnavailableError && e.status === 0);
  assert.equal(up.at("/lines/c06b").length, 1, "it had reached the upstream: the outcome was unknown to the worker");
  assert.equal(proxy.seen.filter((s) => s.path === "/v1/proxy/inventory/lines/c06b").length, 1);
  assert.equal(lease.signal.aborted, false);
  await lease.release();
});

test("C07 release on exit, even after an exception", async () => {
  const res = resource("c07");
  const c = new Client(gw.url, { holder: "c07" });
  const boom = new Error("boom");
  let held;
  await assert.rejects(
    c.using(res, { ttlMs: 5000 }, async (lease) => {
      held = lease;
      throw boom;
    }),
    (e) => e === boom,
  );
  const next = await c.acquire(res, { ttlMs: 5000 }); // no wait: free at once
  assert.equal(next.token, held.token + 1);
  const err = await held.request("POST", "inventory", "/stock/c07", { body: "1" }).catch((e) => e);
  assert.ok(err instanceof StaleLeaseError);
  assert.ok(["lease_released", "stale_token"].includes(err.code), err.code);
  await next.release();

  // And after a normal return, with the routine's value.
  const v = await c.using(res, { ttlMs: 5000 }, async (lease) => lease.token);
  assert.equal(v, next.token + 1);
  const again = await c.acquire(res, { ttlMs: 5000 });
  assert.equal(again.token, v + 1);
  await again.release();
});

test("C10 a held resource is LeaseHeld, with who and for how long", async () => {
  const res = resource("c10");
  const a = await new Client(gw.url, { holder: "pod-a" }).acquire(res, { ttlMs: 5000 });
  const b = new Client(gw.url, { holder: "pod-b" });
  const err = await b.acquire(res, { ttlMs: 5000 }).catch((e) => e);
  assert.ok(err instanceof LeaseHeldError, String(err));
  assert.ok(!(err instanceof LeaseLostError) && !(err instanceof UnavailableError));
  assert.equal(err.code, "lease_held");
  assert.equal(err.holder, "pod-a");
  assert.equal(err.currentToken, a.token);
  assert.ok(err.retryAfter >= 1, `retryAfter ${err.retryAfter}`);
  assert.ok(err.expiresAt instanceof Date);
  // With a wait, acquire gets it once the holder releases.
  const waiting = b.acquire(res, { ttlMs: 5000, waitMs: 10_000 });
  await a.release();
  const lb = await waiting;
  assert.equal(lb.token, a.token + 1);
  await lb.release();
});

test("C14 an acquire that waited longer than its TTL hands out a live lease", async () => {
  const res = resource("c10b");
  // A holds for 1.5 s and stalls (its renewals hang); B asks for 1 s leases and waits.
  proxy.fault = (req) => (req.url.endsWith("/renew") ? "hang" : "pass");
  const a = await new Client(proxy.url, { holder: "pod-a" }).acquire(res, { ttlMs: 1500 });
  const sent = performance.now();
  const b = await new Client(gw.url, { holder: "pod-b" }).acquire(res, { ttlMs: 1000, waitMs: 10_000 });
  assert.ok(performance.now() - sent > 1000, "B waited longer than its TTL");
  assert.equal(b.token, a.token + 1);
  assert.equal(b.signal.aborted, false);
  assert.ok(b.deadline > performance.now());
  const r = await b.request("PUT", "inventory", "/stock/c10b", { body: "1" });
  assert.equal(r.status, 201);
  await r.arrayBuffer();
  await b.release();
  assert.equal(b.signal.aborted, false);
});

test("C11 the upstream's own answers pass through", async () => {
  const lease = await new Client(gw.url, { holder: "c11" }).acquire(resource("c11"), { ttlMs: 5000 });
  const r = await lease.request("POST", "inventory", "/conflict/c11", { body: "x" });
  assert.equal(r.status, 409);
  assert.equal(r.headers.get("content-type"), "application/problem+json");
  assert.equal(JSON.parse(await r.text()).code, "conflict");
  assert.equal(lease.signal.aborted, false);
  const unknown = await lease.request("POST", "nosuch", "/x").catch((e) => e);
  assert.ok(unknown instanceof FencegwError && unknown.constructor === FencegwError, String(unknown));
  assert.equal(unknown.code, "unknown_upstream");
  assert.equal(unknown.status, 404);
  const dead = await lease.request("POST", "dead", "/x", { body: "x" }).catch((e) => e);
  assert.ok(dead instanceof UpstreamError, String(dead));
  assert.equal(dead.code, "upstream_unreachable");
  assert.equal(lease.signal.aborted, false);
  await lease.release();
});

test("C12 paths pass through untouched", async () => {
  const lease = await new Client(gw.url, { holder: "c12" }).acquire(resource("c12"), { ttlMs: 5000 });
  const path = "/accounts/a%2Fb/lines/inventory%2FSKU-001?x=1&y=2";
  const r = await lease.request("POST", "inventory", path, {
    body: JSON.stringify({ qty: 3 }),
    headers: { "Content-Type": "application/vnd.stock+json" },
  });
  assert.equal(r.status, 201);
  await r.arrayBuffer();
  const got = up.at("/accounts/").at(-1);
  assert.deepEqual(got, {
    method: "POST",
    path,
    body: '{"qty":3}',
    contentType: "application/vnd.stock+json",
    token: String(lease.token),
    hadLease: false,
    key: null,
  });
  await lease.release();
});

test("C13 unknown problem codes are carried as data", () => {
  // A recorded answer of a newer gateway, with a code this SDK does not know.
  const text = JSON.stringify({ type: "urn:fencegw:problem:quota_frozen", title: "Quota frozen", status: 423, code: "quota_frozen", detail: "frozen", shard: 7 });
  const problem = parseProblem(text);
  const err = errorFor("write", 423, problem, 2000);
  assert.equal(err.constructor, FencegwError);
  assert.equal(err.code, "quota_frozen");
  assert.equal(err.status, 423);
  assert.equal(err.problem.shard, 7);
  assert.equal(err.retryAfter, 2);
  // An upstream's own problem is not the gateway's.
  assert.equal(parseProblem(JSON.stringify({ type: "https://x.example/p", status: 409, code: "stale_token" })), undefined);
});

test("C08 a gateway's 503 is unavailable, with its Retry-After", () => {
  // Recorded answers: the embedded store this suite runs on does not fail.
  for (const code of ["store_unavailable", "fence_busy", "fence_lost"]) {
    const problem = parseProblem(JSON.stringify({ type: `urn:fencegw:problem:${code}`, title: "Unavailable", status: 503, code }));
    const err = errorFor("acquire", 503, problem, 1000);
    assert.ok(err instanceof UnavailableError && !(err instanceof LeaseLostError), code);
    assert.equal(err.code, code);
    assert.equal(err.retryAfter, 1);
  }
});
