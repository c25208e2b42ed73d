// One inventory pod: under a lease on the SKU, read the stock figure, take
// DELTA units off it, and write the new figure back through fencegw.
//
//   FENCEGW_URL=http://127.0.0.1:8080 POD=a DELTA=3 node worker.mjs
//
// STALL_UNTIL=FILE makes the pod stall between its read and its write,
// with its event loop blocked (renewals included, as in a long GC pause or
// a stopped container) until FILE exists. It then writes an old figure
// over a newer one: the gateway refuses that write, and the pod learns
// that its lease was lost. Exit status: 0 written, 3 refused as stale,
// 4 aborted in flight by the lease's loss (its outcome unknown).
import { existsSync } from "node:fs";
import { Client, LeaseLostError, StaleLeaseError } from "@fencegw/client";

const gateway = process.env.FENCEGW_URL ?? "http://127.0.0.1:8080";
const pod = process.env.POD ?? "a";
const delta = Number(process.env.DELTA ?? 1);
const sku = process.env.SKU ?? "SKU-001";
const ttlMs = Number(process.env.TTL_MS ?? 2000);
const log = (msg) => console.log(`pod ${pod}: ${msg}`);

const client = new Client(gateway, { holder: `pod-${pod}` });

const status = await client.using(`inventory/${sku}`, { ttlMs, waitMs: 10_000 }, async (lease, signal) => {
  log(`holds inventory/${sku} with token ${lease.token}`);
  signal.addEventListener("abort", () => log(`lease lost: ${signal.reason.message}`));

  const read = await lease.request("GET", "inventory", `/stock/${encodeURIComponent(sku)}`);
  const { qty } = await read.json();
  const next = qty - delta;
  log(`read ${qty}, will write ${next}`);

  if (process.env.STALL_UNTIL) {
    log("stalling");
    const block = new Int32Array(new SharedArrayBuffer(4));
    while (!existsSync(process.env.STALL_UNTIL)) Atomics.wait(block, 0, 0, 20);
    log("woke up");
  }

  try {
    const wrote = await lease.request("PUT", "inventory", `/stock/${encodeURIComponent(sku)}`, {
      body: JSON.stringify({ qty: next }),
      headers: { "Content-Type": "application/json", "X-Pod": pod },
    });
    log(`wrote ${next}: ${wrote.status}`);
    return 0;
  } catch (err) {
    if (err instanceof StaleLeaseError) {
      log(`write of ${next} refused: ${err.code} (token ${err.token}, current ${err.currentToken}); lease lost: ${signal.aborted}`);
      return 3;
    }
    if (err instanceof LeaseLostError) {
      log(`write of ${next} aborted in flight: ${err.message}`);
      return 4;
    }
    throw err;
  }
});
process.exitCode = status;
