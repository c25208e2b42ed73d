// A TypeScript worker against fencegw, using a client generated from
// api/openapi.yaml by openapi-typescript (src/fencegw.d.ts) and openapi-fetch.
//
// It replays the classic incident through the gateway:
//   1. worker A acquires the lease (ttl 1000 ms) and gets token T,
//   2. A stalls for 1500 ms (a GC pause, a slow call...): its lease expires,
//   3. worker B acquires the lease, gets a token > T and writes through the
//      gateway: the write reaches the upstream,
//   4. A wakes up and writes: the gateway answers 409 stale_token and the
//      write never reaches the upstream,
//   5. the rejection log (GET /v1/rejections) shows A's refused write.
// Every step is checked; the process exits 1 if anything differs.
//
// Environment:
//   FENCEGW_URL        the gateway (default http://127.0.0.1:8080)
//   FENCEGW_UPSTREAM   the upstream's name in the gateway (default statements)
//   UPSTREAM_URL       optional: the upstream itself (upstream.mjs), to check
//                      what landed there (only B's write, no lease secret)
import createClient from "openapi-fetch";
import type { components, paths } from "./fencegw.js";

type Lease = components["schemas"]["Lease"];
type Problem = components["schemas"]["Problem"];
type Rejection = components["schemas"]["Rejection"];

const base = (process.env.FENCEGW_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
const upstream = process.env.FENCEGW_UPSTREAM ?? "statements";
const upstreamURL = process.env.UPSTREAM_URL?.replace(/\/+$/, "");

const TTL_MS = 1000;
const STALL_MS = 1500;
const REQUEST_TIMEOUT_MS = 10_000;

// Every request, generated or not, gives up after REQUEST_TIMEOUT_MS.
const timedFetch = (input: Request) => fetch(input, { signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
const api = createClient<paths>({ baseUrl: base, fetch: timedFetch });

let failures = 0;
function check(ok: boolean, what: string, got?: unknown): void {
  if (ok) {
    console.log(`  ok    ${what}`);
  } else {
    failures++;
    console.log(`  FAIL  ${what}${got === undefined ? "" : `: got ${JSON.stringify(got)}`}`);
  }
}
// A step that cannot go on without its result.
class Abort extends Error {}
function must<T>(value: T | undefined, what: string, got: unknown): T {
  check(value !== undefined, what, got);
  if (value === undefined) throw new Abort(what);
  return value;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// Acquire. wait_ms is optional in the generated types (the spec gives it
// no `default`, which openapi-typescript 7 would turn into a required
// property): without it the gateway answers at once.
async function acquire(resource: string, holder: string, ttl_ms: number, wait_ms?: number): Promise<Lease> {
  const { data, error, response } = await api.POST("/v1/leases", {
    body: wait_ms === undefined ? { resource, holder, ttl_ms } : { resource, holder, ttl_ms, wait_ms },
  });
  return must(
    response.status === 201 ? data : undefined,
    `${holder} acquires ${resource} (201)`,
    { status: response.status, error },
  );
}

// A fenced write. The proxy is not an operation of the spec (a generated
// client would percent-encode the slashes of a multi-segment path and fix
// the content type; see the spec's description), so writes use plain
// fetch against the same base URL, with the lease in Fencing-Lease. The
// path, query and Content-Type go to the upstream exactly as sent.
const WRITE_TYPE = "text/csv; charset=utf-8";
async function fencedWrite(lease: Lease, pathAndQuery: string, body: string): Promise<Response> {
  return fetch(`${base}/v1/proxy/${encodeURIComponent(upstream)}/${pathAndQuery}`, {
    method: "POST",
    headers: { "Fencing-Lease": lease.lease_id, "Content-Type": WRITE_TYPE },
    body,
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
}

async function main(): Promise<void> {
  const acct = `${Date.now()}${Math.floor(Math.random() * 1000)}`;
  const resource = `stmt:acct:${acct}`;
  const writePath = `statements/${acct}/lines`;
  const writeQuery = "?source=ts-worker&n=1";
  console.log(`fencegw at ${base}, upstream "${upstream}", resource ${resource}`);

  console.log("0. the gateway says where things are (GET /v1, in the spec)");
  const idx = await api.GET("/v1");
  check(idx.data?.openapi_yaml === "/v1/openapi.yaml" && idx.data?.proxy === "/v1/proxy/{upstream}/{path}",
    "GET /v1 lists the spec and the proxy", idx.data ?? idx.error);

  console.log(`1. worker A acquires (ttl ${TTL_MS} ms, no wait_ms)`);
  const a = await acquire(resource, "worker-a", TTL_MS);
  check(a.state === "current" && a.token >= 1, `A holds token ${a.token}`, a);
  check(a.lease_id.length >= 22, "A's lease id is an unguessable secret", a.lease_id.length);

  console.log(`2. worker A stalls ${STALL_MS} ms`);
  await sleep(STALL_MS);

  console.log("3. worker B acquires and writes");
  const b = await acquire(resource, "worker-b", 10_000, 2_000);
  check(b.token > a.token, `B's token ${b.token} > A's token ${a.token}`, b.token);
  const bw = await fencedWrite(b, writePath + writeQuery, `worker-b,${b.token},B's statement line\n`);
  check(bw.status === 200, "B's write reaches the upstream (200)", { status: bw.status, body: await bw.text() });

  console.log("4. worker A wakes up and writes");
  const aw = await fencedWrite(a, writePath + writeQuery, `worker-a,${a.token},A's stale statement line\n`);
  check(aw.status === 409, "A's write is refused with 409", aw.status);
  check(
    (aw.headers.get("content-type") ?? "").startsWith("application/problem+json"),
    "as application/problem+json",
    aw.headers.get("content-type"),
  );
  const problem = (await aw.json().catch(() => ({}))) as Partial<Problem>;
  check(problem.code === "stale_token", "code stale_token", problem);
  check(problem.token === a.token && problem.current_token === b.token,
    `token ${a.token} vs current_token ${b.token}`, problem);

  // The generated client types error bodies as Problem too.
  const renew = await api.POST("/v1/leases/{lease_id}/renew", {
    params: { path: { lease_id: a.lease_id } },
    body: {},
  });
  check(renew.response.status === 409 && renew.error?.code === "lease_lost",
    "A cannot renew: 409 lease_lost", { status: renew.response.status, error: renew.error });
  const got = await api.GET("/v1/leases/{lease_id}", { params: { path: { lease_id: a.lease_id } } });
  check(got.data?.state === "superseded", "A's lease is superseded", got.data ?? got.error);

  console.log("5. the rejection log shows A's refused write");
  const list = await api.GET("/v1/rejections", { params: { query: { resource, limit: 10 } } });
  const items: Rejection[] = must(list.data?.items, "GET /v1/rejections (200)",
    { status: list.response.status, error: list.error });
  const mine = items.find((r) => r.code === "stale_token" && r.token === a.token);
  check(mine !== undefined, `a stale_token rejection of token ${a.token} is listed`, items);
  if (mine) {
    check(mine.holder === "worker-a" && mine.current_token === b.token && mine.resource === resource,
      "it names holder worker-a, the resource and the current token", mine);
    check(mine.method === "POST" && mine.upstream === upstream && mine.path === `/${writePath}`,
      "and the refused request", mine);
    check(!JSON.stringify(mine).includes(a.lease_id), "and never A's whole lease id", mine.lease_hint);
  }

  const rel = await api.DELETE("/v1/leases/{lease_id}", { params: { path: { lease_id: b.lease_id } } });
  check(rel.response.status === 204, "B releases its lease (204)", { status: rel.response.status, error: rel.error });

  if (upstreamURL) {
    console.log("6. the upstream received only B's write");
    const res = await fetch(`${upstreamURL}/_received`, { signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
    const all = (await res.json()) as Array<Record<string, string | null>>;
    const here = all.filter((r) => r.path?.startsWith(`/${writePath}`));
    check(here.length === 1, "exactly one write landed", here);
    const w = here[0];
    if (w) {
      check(w.body?.includes("worker-b") === true, "it is B's", w.body);
      check(w.path === `/${writePath}${writeQuery}`, `at exactly the path and query sent (/${writePath}${writeQuery})`, w.path);
      check(w.content_type === WRITE_TYPE, `with exactly the Content-Type sent (${WRITE_TYPE})`, w.content_type);
      check(w.fencing_token === String(b.token) && w.fencing_resource === resource,
        `with Fencing-Token ${b.token} and Fencing-Resource`, w);
      check(w.fencing_lease === null, "and without the Fencing-Lease secret", w.fencing_lease);
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
  // An Abort was counted by the check that threw it.
  if (!(err instanceof Abort)) {
    failures++;
    console.log(`FAIL  ${err instanceof Error ? err.stack ?? err.message : String(err)}`);
  }
}
console.log(failures === 0 ? "PASS: the stale write was fenced and recorded" : `FAIL: ${failures} check(s) failed`);
process.exitCode = failures === 0 ? 0 : 1;
