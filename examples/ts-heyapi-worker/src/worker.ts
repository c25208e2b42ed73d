// A TypeScript worker against fencegw, using a client generated from
// api/openapi.yaml by @hey-api/openapi-ts at its default options
// (src/client: types, one function per operation, and its fetch client).
//
// It replays the classic incident through the gateway:
//   1. worker A acquires the lease (ttl 1000 ms, no wait_ms) and gets token T,
//   2. A stalls for 1500 ms (a GC pause, a slow call...): its lease expires,
//   3. worker B acquires the lease, gets a token > T and writes through the
//      gateway: the write reaches the upstream at exactly the path, query
//      and content type B sent,
//   4. A wakes up and writes: the gateway answers 409 stale_token and the
//      write never reaches the upstream,
//   5. the rejection log (GET /v1/rejections) shows A's refused write.
// Every step is checked; the process exits 1 if anything differs.
//
// Environment:
//   FENCEGW_URL        the gateway (default http://127.0.0.1:8080)
//   FENCEGW_UPSTREAM   the upstream's name in the gateway (default statements)
//   UPSTREAM_URL       optional: the upstream itself (../ts-worker/upstream.mjs),
//                      to check what landed there
import { client } from "./client/client.gen.js";
import { acquireLease, getIndex, getLease, listRejections, releaseLease, renewLease } from "./client/sdk.gen.js";
import type { AcquireRequest, Lease, Problem } from "./client/types.gen.js";

const base = (process.env.FENCEGW_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
const upstream = process.env.FENCEGW_UPSTREAM ?? "statements";
const upstreamURL = process.env.UPSTREAM_URL?.replace(/\/+$/, "");
const TTL_MS = 1000;
const STALL_MS = 1500;
const REQUEST_TIMEOUT_MS = 10_000;

// Every request gives up after REQUEST_TIMEOUT_MS.
client.setConfig({
  baseUrl: base,
  fetch: (input: RequestInfo | URL, init?: RequestInit) =>
    fetch(input, { ...init, signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) }),
});

let failures = 0;
function check(ok: boolean, what: string, got?: unknown): void {
  if (ok) {
    console.log(`  ok    ${what}`);
  } else {
    failures++;
    console.log(`  FAIL  ${what}${got === undefined ? "" : `: got ${JSON.stringify(got)}`}`);
  }
}
class Abort extends Error {}
function must<T>(value: T | undefined, what: string, got: unknown): T {
  check(value !== undefined, what, got);
  if (value === undefined) throw new Abort(what);
  return value;
}
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function acquire(body: AcquireRequest): Promise<Lease> {
  const { data, error, response } = await acquireLease({ body });
  return must(response.status === 201 ? data : undefined, `${body.holder} acquires ${body.resource} (201)`,
    { status: response.status, error });
}

// A fenced write. The proxy is not an operation of the spec (a generated
// function would percent-encode the slashes of a multi-segment path and fix
// the content type; see the spec's description), so it goes through the
// generated client's generic request with a literal URL: same base URL,
// same fetch, no path parameters to encode, and the body sent as is with
// the caller's Content-Type (bodySerializer null).
const WRITE_TYPE = "application/x-ndjson";
async function fencedWrite(lease: Lease, path: string, body: string) {
  return client.post({
    url: `/v1/proxy/${encodeURIComponent(upstream)}/${path}`,
    query: { source: "heyapi", n: 2 },
    headers: { "Fencing-Lease": lease.lease_id, "Content-Type": WRITE_TYPE },
    body,
    bodySerializer: null,
    parseAs: "text",
  });
}

async function main(): Promise<void> {
  const acct = `${Date.now()}${Math.floor(Math.random() * 1000)}`;
  const resource = `stmt:acct:${acct}`;
  const writePath = `statements/${acct}/lines`;
  console.log(`fencegw at ${base}, upstream "${upstream}", resource ${resource} (@hey-api/openapi-ts client)`);

  console.log("0. the gateway says where things are (GET /v1)");
  const idx = await getIndex();
  check(idx.data?.openapi_json === "/v1/openapi.json" && idx.data?.proxy === "/v1/proxy/{upstream}/{path}",
    "GET /v1 lists the spec and the proxy", idx.data ?? idx.error);

  console.log(`1. worker A acquires (ttl ${TTL_MS} ms, no wait_ms)`);
  const a = await acquire({ resource, holder: "worker-a", ttl_ms: TTL_MS });
  check(a.state === "current" && a.token >= 1, `A holds token ${a.token}`, a);

  console.log(`2. worker A stalls ${STALL_MS} ms`);
  await sleep(STALL_MS);

  console.log("3. worker B acquires and writes");
  const b = await acquire({ resource, holder: "worker-b", ttl_ms: 10_000, wait_ms: 2_000 });
  check(b.token > a.token, `B's token ${b.token} > A's token ${a.token}`, b.token);
  const bw = await fencedWrite(b, writePath, JSON.stringify({ line: "B's statement line", writer: "worker-b" }) + "\n");
  check(bw.response?.status === 200, "B's write reaches the upstream (200)", { status: bw.response?.status, error: bw.error });

  console.log("4. worker A wakes up and writes");
  const aw = await fencedWrite(a, writePath, JSON.stringify({ line: "A's stale line", writer: "worker-a" }) + "\n");
  check(aw.response?.status === 409, "A's write is refused with 409", aw.response?.status);
  check((aw.response?.headers.get("content-type") ?? "").startsWith("application/problem+json"),
    "as application/problem+json", aw.response?.headers.get("content-type"));
  // The client parses an error body as JSON when it is JSON.
  const problem = (typeof aw.error === "object" && aw.error !== null ? aw.error : {}) as Partial<Problem>;
  check(problem.code === "stale_token" && problem.token === a.token && problem.current_token === b.token,
    `code stale_token, token ${a.token} vs current_token ${b.token}`, problem);

  const renew = await renewLease({ path: { lease_id: a.lease_id }, body: {} });
  check(renew.response.status === 409 && renew.error?.code === "lease_lost",
    "A cannot renew: 409 lease_lost", { status: renew.response.status, error: renew.error });
  const got = await getLease({ path: { lease_id: a.lease_id } });
  check(got.data?.state === "superseded", "A's lease is superseded", got.data ?? got.error);

  console.log("5. the rejection log shows A's refused write");
  const list = await listRejections({ query: { resource, limit: 10 } });
  const items = must(list.data?.items, "GET /v1/rejections (200)", { status: list.response.status, error: list.error });
  const mine = items.find((r) => r.code === "stale_token" && r.token === a.token);
  check(mine?.holder === "worker-a" && mine.current_token === b.token && mine.path === `/${writePath}`,
    `a stale_token rejection of token ${a.token} by worker-a is listed`, items);

  const rel = await releaseLease({ path: { lease_id: b.lease_id } });
  check(rel.response.status === 204, "B releases its lease (204)", { status: rel.response.status, error: rel.error });

  if (upstreamURL) {
    console.log("6. the upstream received only B's write, as sent");
    const res = await fetch(`${upstreamURL}/_received`, { signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
    const all = (await res.json()) as Array<Record<string, string | null>>;
    const here = all.filter((r) => r.path?.startsWith(`/${writePath}`));
    check(here.length === 1 && here[0]?.body?.includes("worker-b") === true, "exactly one write landed, B's", here);
    const w = here[0];
    if (w) {
      check(w.path === `/${writePath}?source=heyapi&n=2`, "at exactly the path and query sent", w.path);
      check(w.content_type === WRITE_TYPE, `with exactly the Content-Type sent (${WRITE_TYPE})`, w.content_type);
      check(w.fencing_token === String(b.token) && w.fencing_lease === null,
        `with Fencing-Token ${b.token} and without the Fencing-Lease secret`, w);
    }
  }
}

const watchdog = setTimeout(() => {
  console.log("FAIL  the worker did not finish within 60 s");
  process.exit(1);
}, 60_000);
watchdog.unref();

try {
  await main();
} catch (err) {
  if (!(err instanceof Abort)) {
    failures++;
    console.log(`FAIL  ${err instanceof Error ? err.stack ?? err.message : String(err)}`);
  }
}
console.log(failures === 0 ? "PASS: the stale write was fenced and recorded" : `FAIL: ${failures} check(s) failed`);
process.exitCode = failures === 0 ? 0 : 1;
