"""The README's promises about a worker that stalls past its TTL, run as
written: its stall example executed verbatim (only the gateway's address
replaced), and a worker process frozen with SIGSTOP for longer than the TTL.
Both must see the loss signalled and the stale write refused."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import unittest
from typing import Any, List

from env import HERE, GatewayTestCase

SRC = os.path.join(HERE, "..", "src")
README = os.path.join(HERE, "..", "README.md")


def python_blocks(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


class TestReadme(GatewayTestCase):
    def run_worker(self, code: str, **kw: Any) -> "subprocess.Popen[str]":
        env = dict(os.environ, PYTHONPATH=SRC)
        return subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)

    def test_worked_example_runs_as_written(self) -> None:
        blocks = [b for b in python_blocks(README) if "build_statement()" in b]
        self.assertEqual(len(blocks), 1, "the README's worked example is gone")
        code = "def build_statement():\n    return 'acct,amount\\n88213,5\\n'\n" + blocks[0]
        code = code.replace("http://127.0.0.1:8080", self.gw.url).replace("stmt:acct:88213", "stmt:acct:readme-0")
        p = self.run_worker(code)
        out, _ = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("201 text/plain b'line added'", out)
        last = [a for a in self.up.seen() if a["path"] == "/accounts/88213/lines"][-1]
        self.assertEqual((last["body"], last["content_type"]), (b"acct,amount\n88213,5\n", "text/csv"))
        self.assertTrue(last["key"])

    def test_stall_example_runs_as_written(self) -> None:
        blocks = [b for b in python_blocks(README) if "lease.orphan()" in b]
        self.assertEqual(len(blocks), 1, "the README's stall example is gone")
        code = blocks[0].replace("http://127.0.0.1:8080", self.gw.url).replace("stmt:acct:88213", "stmt:acct:readme-1")
        p = self.run_worker(code)
        out, _ = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("refused: lease_expired", out)
        self.assertFalse([a for a in self.up.seen() if a["body"] == b"statement"], "the stale write reached the upstream")

    def test_worker_frozen_with_sigstop_past_its_ttl(self) -> None:
        code = textwrap.dedent(f"""
            import json, sys, time, fencegw
            client = fencegw.Client({self.gw.url!r}, holder="frozen")
            with client.lease("stmt:acct:readme-2", ttl=1) as lease:
                print("acquired", flush=True)
                sys.stdin.readline()                  # the parent freezes and thaws us meanwhile
                out = {{}}
                try:
                    lease.check()
                    out["check"] = "passed"
                except fencegw.LeaseLost as err:
                    out["check"] = type(err).__name__
                out["lost"] = lease.lost.wait(10)
                try:
                    lease.request("POST", "statements", "/accounts/readme-2/lines", body="after the freeze")
                    out["write"] = "accepted"
                except fencegw.StaleLease as err:
                    out["write"] = err.code
                print(json.dumps(out), flush=True)
        """)
        p = self.run_worker(code)
        self.addCleanup(p.kill)
        assert p.stdout is not None and p.stdin is not None
        self.assertEqual(p.stdout.readline().strip(), "acquired")
        p.send_signal(signal.SIGSTOP)
        time.sleep(2.5)  # the freeze: longer than the TTL (1 s)
        p.send_signal(signal.SIGCONT)
        p.stdin.write("go\n")
        p.stdin.flush()
        out, _ = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, out)
        got = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
        self.assertEqual(got, {"check": "LeaseLost", "lost": True, "write": "lease_expired"}, out)
        self.assertFalse([a for a in self.up.seen() if a["body"] == b"after the freeze"])


if __name__ == "__main__":
    unittest.main()
