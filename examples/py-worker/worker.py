"""A Python worker against fencegw, using a client generated from
api/openapi.yaml by openapi-python-client at its default options
(``openapi-python-client generate --path ../../api/openapi.yaml``, which
writes the package ``fencegw_client`` into ``fencegw-client/``).

It replays the classic incident through the gateway:

1. worker A acquires the lease (ttl 1000 ms, no wait_ms) and gets token T;
2. A stalls for 1500 ms (a GC pause, a slow call...): its lease expires;
3. worker B acquires the lease, gets a token > T and writes through the
   gateway: the write reaches the upstream at exactly the path, query and
   Content-Type B sent;
4. A wakes up and writes: the gateway answers 409 stale_token and the write
   never reaches the upstream;
5. the rejection log (GET /v1/rejections) shows A's refused write.

Every step is checked; the process exits 1 if anything differs.

Environment: FENCEGW_URL (default http://127.0.0.1:8080), FENCEGW_UPSTREAM
(default statements), UPSTREAM_URL (optional: ../ts-worker/upstream.mjs, to
check what landed there).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any
from urllib.parse import quote

import httpx

from fencegw_client import Client
from fencegw_client.api.leases import acquire_lease, get_lease, release_lease, renew_lease
from fencegw_client.api.operations import get_index
from fencegw_client.api.rejections import list_rejections
from fencegw_client.models import AcquireRequest, Lease, RenewRequest

BASE = os.environ.get("FENCEGW_URL", "http://127.0.0.1:8080").rstrip("/")
UPSTREAM = os.environ.get("FENCEGW_UPSTREAM", "statements")
UPSTREAM_URL = os.environ.get("UPSTREAM_URL", "").rstrip("/")
TTL_MS = 1000
STALL_S = 1.5
WRITE_TYPE = "text/csv; charset=utf-8"

client = Client(base_url=BASE, timeout=httpx.Timeout(10.0))
failures = 0


def check(ok: bool, what: str, got: Any = None) -> None:
    global failures
    if ok:
        print(f"  ok    {what}")
    else:
        failures += 1
        print(f"  FAIL  {what}" + ("" if got is None else f": got {got!r}"))


class Abort(Exception):
    pass


def body_json(content: bytes) -> dict[str, Any]:
    """The JSON object of an answer (a problem document, say), or {}."""
    try:
        v = json.loads(content)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def as_lease(resp: Any) -> Lease | None:
    """The Lease of a 2xx answer, whether or not the generated code parsed it."""
    if isinstance(resp.parsed, Lease):
        return resp.parsed
    doc = body_json(resp.content)
    return Lease.from_dict(doc) if doc else None


def state_of(lease: Lease) -> str:
    # LeaseState is a closed enum in the spec: a generated str Enum.
    return str(getattr(lease.state, "value", lease.state))


def acquire(resource: str, holder: str, ttl_ms: int, wait_ms: int | None = None) -> Lease:
    # wait_ms is optional: without it the gateway answers at once.
    req = AcquireRequest(resource=resource, ttl_ms=ttl_ms, holder=holder)
    if wait_ms is not None:
        req.wait_ms = wait_ms
    resp = acquire_lease.sync_detailed(client=client, body=req)
    lease = as_lease(resp) if resp.status_code == 201 else None
    check(lease is not None, f"{holder} acquires {resource} (201)", (resp.status_code, resp.content[:200]))
    if lease is None:
        raise Abort(holder)
    return lease


def fenced_write(lease: Lease, path_and_query: str, body: str) -> httpx.Response:
    """A fenced write. The proxy is not an operation of the spec (a generated
    function would percent-encode the slashes of a multi-segment path and send
    application/octet-stream; see the spec's description), so it goes through
    the generated client's own httpx client: same base URL, timeouts and
    headers, a literal path, the body and Content-Type as the caller has them.
    """
    return client.get_httpx_client().post(
        f"/v1/proxy/{quote(UPSTREAM, safe='')}/{path_and_query}",
        content=body.encode(),
        headers={"Fencing-Lease": lease.lease_id, "Content-Type": WRITE_TYPE},
    )


def main() -> None:
    acct = f"{int(time.time() * 1000)}{random.randrange(1000)}"
    resource = f"stmt:acct:{acct}"
    write_path = f"statements/{acct}/lines"
    write_query = "?source=py-worker&n=3"
    print(f'fencegw at {BASE}, upstream "{UPSTREAM}", resource {resource} (openapi-python-client)')

    print("0. the gateway says where things are (GET /v1)")
    idx = get_index.sync_detailed(client=client)
    doc = body_json(idx.content)
    check(idx.status_code == 200 and doc.get("openapi_yaml") == "/v1/openapi.yaml", "GET /v1 lists the spec", doc)

    print(f"1. worker A acquires (ttl {TTL_MS} ms, no wait_ms)")
    a = acquire(resource, "worker-a", TTL_MS)
    check(state_of(a) == "current" and a.token >= 1, f"A holds token {a.token}", a)

    print(f"2. worker A stalls {STALL_S} s")
    time.sleep(STALL_S)

    print("3. worker B acquires and writes")
    b = acquire(resource, "worker-b", 10_000, wait_ms=2_000)
    check(b.token > a.token, f"B's token {b.token} > A's token {a.token}", b.token)
    bw = fenced_write(b, write_path + write_query, f"worker-b,{b.token},B's statement line\n")
    check(bw.status_code == 200, "B's write reaches the upstream (200)", (bw.status_code, bw.text[:200]))

    print("4. worker A wakes up and writes")
    aw = fenced_write(a, write_path + write_query, f"worker-a,{a.token},A's stale statement line\n")
    check(aw.status_code == 409, "A's write is refused with 409", aw.status_code)
    check(aw.headers.get("content-type", "").startswith("application/problem+json"), "as application/problem+json",
          aw.headers.get("content-type"))
    problem = body_json(aw.content)
    # Problem.code is an open string: match the codes you know.
    check(problem.get("code") == "stale_token" and problem.get("token") == a.token
          and problem.get("current_token") == b.token, f"code stale_token, token {a.token} vs {b.token}", problem)

    renew = renew_lease.sync_detailed(a.lease_id, client=client, body=RenewRequest())
    check(renew.status_code == 409 and body_json(renew.content).get("code") == "lease_lost",
          "A cannot renew: 409 lease_lost", (renew.status_code, renew.content[:200]))
    got = get_lease.sync_detailed(a.lease_id, client=client)
    lease = as_lease(got) if got.status_code == 200 else None
    check(lease is not None and state_of(lease) == "superseded", "A's lease is superseded", got.content[:200])

    print("5. the rejection log shows A's refused write")
    rej = list_rejections.sync_detailed(client=client, resource=resource, limit=10)
    items = body_json(rej.content).get("items", [])
    mine = [r for r in items if r.get("code") == "stale_token" and r.get("token") == a.token]
    check(len(mine) == 1 and mine[0].get("holder") == "worker-a" and mine[0].get("path") == f"/{write_path}",
          f"a stale_token rejection of token {a.token} by worker-a is listed", items)

    rel = release_lease.sync_detailed(b.lease_id, client=client)
    check(rel.status_code == 204, "B releases its lease (204)", rel.status_code)

    if UPSTREAM_URL:
        print("6. the upstream received only B's write, as sent")
        received = httpx.get(f"{UPSTREAM_URL}/_received", timeout=10.0).json()
        here = [r for r in received if (r.get("path") or "").startswith(f"/{write_path}")]
        check(len(here) == 1 and "worker-b" in (here[0].get("body") or ""), "exactly one write landed, B's", here)
        if here:
            w = here[0]
            check(w.get("path") == f"/{write_path}{write_query}", "at exactly the path and query sent", w.get("path"))
            check(w.get("content_type") == WRITE_TYPE, f"with exactly the Content-Type sent ({WRITE_TYPE})",
                  w.get("content_type"))
            check(w.get("fencing_token") == str(b.token) and w.get("fencing_lease") is None,
                  f"with Fencing-Token {b.token} and without the Fencing-Lease secret", w)


if __name__ == "__main__":
    try:
        main()
    except Abort:
        pass  # counted by the check that raised it
    print("PASS: the stale write was fenced and recorded" if failures == 0 else f"FAIL: {failures} check(s) failed")
    sys.exit(0 if failures == 0 else 1)
