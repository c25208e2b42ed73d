#!/usr/bin/env python3
"""Share of a CPU profile's samples per stage of a fenced write, from `go tool pprof -traces`.

Usage: scripts/pprof-shares.py BINARY PROFILE   (a profile of the gateway's process, e.g.
fencegw-load -setups gateway -cpuprofile gw.cpu; docs/benchmarks.md). Each sample goes to the
first stage whose predicate matches its stack; "of which syscalls" are samples whose leaf is a
system call, "of which malloc" those with runtime.mallocgc on the stack. Prints a Markdown table.
"""
import re, subprocess, sys, collections
binary, prof = sys.argv[1], sys.argv[2]
out = subprocess.run(["go", "tool", "pprof", "-traces", binary, prof], capture_output=True, text=True).stdout
blocks = out.split("-----------+-------------------------------------------------------")[1:]
def ms(v):
    m = re.match(r"([\d.]+)(ms|s|us|µs)", v)
    x = float(m.group(1)); u = m.group(2)
    return x * {"ms": 1, "s": 1000, "us": 1e-3, "µs": 1e-3}[u]
# (name, predicate over the stack, leaf first); first match wins
def has(st, *names): return any(any(n in f for f in st) for n in names)
rules = [
 ("GC (background mark, sweep, assists)", lambda s: has(s, "runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge", "runtime.gcAssistAlloc", "runtime.gcMarkTermination", "runtime.gcStart")),
 ("accept (Server.Serve, Accept, new conn)", lambda s: has(s, "net/http.(*Server).Serve") and not has(s, "net/http.(*conn).serve")),
 ("parse: header map (textproto.ReadMIMEHeader)", lambda s: has(s, "net/http.(*conn).readRequest") and has(s, "textproto.readMIMEHeader")),
  ("parse: request line, URL, Request object", lambda s: has(s, "net/http.(*conn).readRequest")),
 ("own loop: parse (parseLean, or http.ReadRequest and Go's server's checks)", lambda s: has(s, "framing.(*ownConn).serveOne", "framing.(*ownConn).mine") and has(s, "framing.parseLean", "net/http.ReadRequest", "framing.checkRequest")),
 ("socket read of the next request + frame scan (framing conn's Read)", lambda s: has(s, "net/http.(*conn).serve", "framing.(*ownConn).serve") and has(s, "framing.(*conn).Read") and not has(s, "gateway.(*Gateway).ServeHTTP")),
 ("Admit (tokens.Service.Admit)", lambda s: has(s, "tokens.(*Service).Admit")),
 ("engine: upstream write + read answer (engine.Transport.Exchange)", lambda s: has(s, "engine.(*Transport).Exchange")),
 ("response to client: body copy (copyAnswer)", lambda s: has(s, "gateway.(*Gateway).copyAnswer")),
 ("response to client: flush at the end (finishRequest)", lambda s: has(s, "net/http.(*response).finishRequest", "framing.(*response).finish")),
 ("request body read (readSmallBody)", lambda s: has(s, "gateway.readSmallBody")),
 ("forwardDirect's own: upstream head, Rewrite, contexts, header maps", lambda s: has(s, "gateway.(*Gateway).forwardDirect")),
 ("dispatch, middleware, serveProxy's checks", lambda s: has(s, "gateway.(*Gateway).ServeHTTP")),
 ("net/http conn loop, deadlines", lambda s: has(s, "net/http.(*conn).serve")),
 ("own loop: accept, connection loop, deadlines", lambda s: has(s, "framing.(*ownConn).serve", "framing.(*listener).acceptLoop")),
 ("net/http background read (connReader.backgroundRead)", lambda s: has(s, "connReader).backgroundRead")),
 ("scheduler, netpoll (idle work)", lambda s: has(s, "runtime.schedule", "runtime.findRunnable", "runtime.mcall", "runtime.sysmon", "runtime.park_m")),
]
tot = 0; cat = collections.Counter(); malloc = collections.Counter(); sysc = collections.Counter()
for b in blocks:
    lines = [l for l in b.strip("\n").split("\n") if l.strip()]
    st = []; v = None
    for l in lines:
        m = re.match(r"\s+([\d.]+(?:ms|s|us|µs))\s+(\S.*)", l)
        if m and v is None:
            v = ms(m.group(1)); st.append(m.group(2).strip()); continue
        if l.strip().startswith("server:") or l.strip().startswith("client:"): continue
        if v is not None: st.append(l.strip())
    if v is None: continue
    tot += v
    name = "other"
    for n, p in rules:
        if p(st): name = n; break
    cat[name] += v
    if has(st, "runtime.mallocgc"): malloc[name] += v
    if st and ("Syscall6" in st[0] or "syscall.Syscall" in st[0] or "RawSyscall" in st[0]): sysc[name] += v
print("| stage | share of gateway CPU | of which syscalls | of which malloc |")
print("|---|---:|---:|---:|")
order = [n for n, _ in rules] + ["other"]
for n in order:
    if cat[n] == 0: continue
    print(f"| {n} | {100*cat[n]/tot:.1f} % | {100*sysc[n]/tot:.1f} % | {100*malloc[n]/tot:.1f} % |")
print(f"| total ({tot/1000:.2f} s of samples) | 100 % | {100*sum(sysc.values())/tot:.1f} % | {100*sum(malloc.values())/tot:.1f} % |")
