// Type-checked only (tsc -p test/types): a TypeScript worker's view of the
// package's declarations, through its public entry point.
import {
  Client,
  Lease,
  FencegwError,
  LeaseHeldError,
  LeaseLostError,
  StaleLeaseError,
  UnavailableError,
  newIdempotencyKey,
  replayed,
  type components,
} from "@fencegw/client";

type Problem = components["schemas"]["Problem"];

export async function worker(url: string): Promise<number> {
  const client = new Client(url, { holder: "pod-a", apiKey: "fgk_x" });
  const qty: number = await client.using("inventory/SKU-001", { ttlMs: 3000, waitMs: 1000 }, async (lease: Lease, signal: AbortSignal) => {
    const r: Response = await lease.request("GET", "inventory", "/stock/SKU-001", { headers: { Accept: "application/json" } });
    const { qty } = (await r.json()) as { qty: number };
    await fetch("http://elsewhere.example/", { signal });
    const w = await lease.request("PUT", "inventory", "/stock/SKU-001", {
      body: JSON.stringify({ qty: qty - 1 }),
      idempotencyKey: newIdempotencyKey(),
    });
    if (replayed(w)) return qty - 1;
    const token: number = lease.token;
    return token;
  });
  const lease = await client.acquire("inventory/SKU-002", { ttlMs: 3000 });
  try {
    lease.check();
  } catch (err) {
    if (err instanceof StaleLeaseError) {
      const current: number | undefined = err.currentToken;
      const p: Problem | undefined = err.problem;
      console.log(current, p?.code);
    } else if (err instanceof LeaseLostError || err instanceof UnavailableError) {
      console.log(err.code, err.status, err.op);
    } else if (err instanceof LeaseHeldError) {
      const s: number = err.retryAfter;
      const who: string | undefined = err.holder;
      console.log(s, who);
    } else if (err instanceof FencegwError) {
      console.log(err.retryAfterMs);
    }
  } finally {
    await lease.release();
  }
  const reason: unknown = lease.signal.reason;
  console.log(reason, lease.lost, lease.error?.message, lease.deadline);
  return qty;
}
