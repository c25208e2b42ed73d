"""broken_lock.py, replayed on the fencegw Python SDK.

The incident: a worker took a lock on an account, then stalled
(``time.sleep(35)`` between the lock and the write) past the lock's TTL;
another worker took the lock and wrote the account's statement; the first
woke up and wrote it again. The customer got two statements.

Here both workers go through the gateway:

1. worker A takes the lease on ``stmt:acct:88213`` (TTL 1 s) and reads the
   ledger: no statement yet;
2. A stalls for 3 s (the ``time.sleep(35)``, scaled down): its renewals stop
   with it (``lease.orphan()`` stands for a frozen process), its lease runs
   out, and ``lease.lost`` is set;
3. worker B waits for the lease (``wait=10``), gets the next token, reads the
   ledger (no statement), writes the statement through the gateway;
4. A wakes and writes its statement as if nothing happened: the gateway
   refuses it (``fencegw.StaleLease``, ``stale_token``) before it reaches the
   upstream;
5. the ledger holds exactly one statement, written under B's token, and the
   gateway's rejection log shows A's refused write.

Every step is checked; the process exits 1 if anything differs.

    FENCEGW_URL=http://127.0.0.1:8080 UPSTREAM_URL=http://127.0.0.1:PORT python3 broken_lock.py

FENCEGW_URL is the gateway (``--upstream statements=UPSTREAM_URL``);
UPSTREAM_URL is the statements service itself (``upstream.py``), read
directly to check what landed there.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, List

import fencegw

GATEWAY = os.environ.get("FENCEGW_URL", "http://127.0.0.1:8080")
UPSTREAM_URL = os.environ.get("UPSTREAM_URL", "").rstrip("/")
ACCOUNT = os.environ.get("ACCOUNT", f"88213-{os.getpid()}")
RESOURCE = f"stmt:acct:{ACCOUNT}"
LINES = f"/accounts/{ACCOUNT}/lines"
TTL = 1.0
STALL = 3.0

failures = 0


def check(ok: bool, what: str, got: Any = None) -> None:
    global failures
    print(f"  {'ok  ' if ok else 'FAIL'}  {what}" + ("" if ok or got is None else f": got {got!r}"), flush=True)
    if not ok:
        failures += 1


def ledger() -> List[dict]:
    """The account's statement lines, read from the upstream itself."""
    with urllib.request.urlopen(UPSTREAM_URL + LINES, timeout=10) as resp:
        return json.load(resp)


a_holds = threading.Event()
b_wrote = threading.Event()


def worker_a() -> None:
    client = fencegw.Client(GATEWAY, holder="worker-a")
    with client.lease(RESOURCE, ttl=TTL) as lease:
        print(f"A: got the lease, token {lease.token}", flush=True)
        check(ledger() == [], "A: no statement yet")
        a_holds.set()
        lease.orphan()  # the process freezes: nothing renews the lease any more
        time.sleep(STALL)  # broken_lock.py's time.sleep(35)
        b_wrote.wait(30)
        check(lease.lost.is_set(), "A: lease.lost was set during the stall")
        try:
            lease.check()
            check(False, "A: lease.check() raises LeaseLost")
        except fencegw.LeaseLost as err:
            check(err.code is None, "A: lease.check() raises LeaseLost (the TTL ran out)", err.code)
        # A writes anyway, as the incident's worker did: the gateway decides.
        try:
            lease.request("POST", "statements", LINES, body="statement for 88213 (A)",
                          headers={"Content-Type": "text/plain"},
                          idempotency_key=fencegw.new_idempotency_key())
            check(False, "A: the stale write is refused")
        except fencegw.StaleLease as err:
            print(f"A: refused: {err}", flush=True)
            check(err.code == "stale_token", "A: the stale write is refused (StaleLease, stale_token)", err.code)
            check(err.token == lease.token and (err.current_token or 0) > lease.token,
                  "A: the refusal names A's token and the newer one", (err.token, err.current_token))


def worker_b() -> None:
    a_holds.wait(30)
    client = fencegw.Client(GATEWAY, holder="worker-b")
    with client.lease(RESOURCE, ttl=10, wait=10) as lease:
        print(f"B: got the lease, token {lease.token}", flush=True)
        if ledger():
            print("B: the statement is already there", flush=True)
        else:
            r = lease.request("POST", "statements", LINES, body="statement for 88213 (B)",
                              headers={"Content-Type": "text/plain"},
                              idempotency_key=fencegw.new_idempotency_key())
            check(r.status == 201, "B: the statement is written", r.status)
        b_wrote.set()
    global b_token
    b_token = lease.token


b_token = 0


def main() -> int:
    if not UPSTREAM_URL:
        print("set UPSTREAM_URL to the statements service (python3 upstream.py)", file=sys.stderr)
        return 2
    print(f"gateway {GATEWAY}, upstream {UPSTREAM_URL}, resource {RESOURCE}", flush=True)
    threads = [threading.Thread(target=w, name=w.__name__) for w in (worker_a, worker_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        check(not t.is_alive(), f"{t.name} finished")

    lines = ledger()
    print(f"ledger: {lines}", flush=True)
    check(len(lines) == 1, "exactly one statement: nothing duplicated", len(lines))
    check(bool(lines) and lines[0]["line"].endswith("(B)") and lines[0]["token"] == str(b_token),
          "it is B's, under B's token", lines)
    query = urllib.parse.urlencode({"resource": RESOURCE})
    with urllib.request.urlopen(f"{GATEWAY.rstrip('/')}/v1/rejections?{query}", timeout=10) as resp:
        items = json.load(resp)["items"]
    check(len(items) == 1 and items[0]["holder"] == "worker-a" and items[0]["code"] == "stale_token",
          "the gateway's rejection log shows A's refused write", items)
    print("PASS" if failures == 0 else f"FAIL: {failures} check(s) failed", flush=True)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
