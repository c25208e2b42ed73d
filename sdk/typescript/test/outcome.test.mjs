// Conformance (sdk/CONFORMANCE.md) C06, the other end: a keyed write whose
// first attempt timed out at the upstream is not forwarded again; the
// gateway's idempotency_outcome_unknown is raised, not retried.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Client, OutcomeUnknownError, UpstreamError, newIdempotencyKey } from "../dist/index.js";
import { startGateway, startUpstream, startProxy, resource } from "./harness.mjs";

let up, gw, proxy;
before(async () => {
  up = await startUpstream();
  gw = await startGateway(up.url, ["--forward-timeout", "300ms", "--drain-period", "100ms"]);
  proxy = await startProxy(gw.url);
});
after(async () => {
  await proxy?.close();
  await gw?.stop();
  await up?.close();
});

test("C06 idempotency_outcome_unknown is raised to the caller, not retried", async () => {
  const lease = await new Client(proxy.url, { holder: "c06c" }).acquire(resource("c06c"), { ttlMs: 5000 });
  const err = await lease
    .request("POST", "inventory", "/hang/c06c", { body: "amount=5", idempotencyKey: newIdempotencyKey() })
    .catch((e) => e);
  assert.ok(err instanceof OutcomeUnknownError, String(err));
  assert.equal(err.code, "idempotency_outcome_unknown");
  const attempts = proxy.seen.filter((s) => s.path === "/v1/proxy/inventory/hang/c06c");
  assert.deepEqual(attempts.map((s) => s.status), [504, 409], "the 504 retried once with the same key, the 409 not");
  assert.equal(up.at("/hang/c06c").length, 1, "forwarded once");
  assert.equal(lease.signal.aborted, false);
  await lease.release();
});

test("C06 without a key an upstream timeout is an UpstreamError, not retried", async () => {
  const lease = await new Client(proxy.url, { holder: "c06d" }).acquire(resource("c06d"), { ttlMs: 5000 });
  const err = await lease.request("POST", "inventory", "/hang/c06d", { body: "x" }).catch((e) => e);
  assert.ok(err instanceof UpstreamError, String(err));
  assert.equal(err.code, "upstream_timeout");
  assert.equal(proxy.seen.filter((s) => s.path === "/v1/proxy/inventory/hang/c06d").length, 1);
  await lease.release();
});
