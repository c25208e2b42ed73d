// The inventory story, end to end: pod a reads the stock figure (10) and
// stalls past its TTL; pod b takes the lease, reads 10 and writes 5; pod a
// wakes up and writes 7 over it. The gateway refuses pod a's write, pod a
// learns its lease was lost, and the figure stays 5.
//
//   FENCEGW_URL=http://127.0.0.1:8080 INVENTORY_URL=http://127.0.0.1:PORT node demo.mjs
//
// (a gateway with --upstream inventory=INVENTORY_URL in front of
// inventory.mjs). Exits 0 if the story ends as it must.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const inventory = process.env.INVENTORY_URL;
if (!process.env.FENCEGW_URL || !inventory) throw new Error("set FENCEGW_URL and INVENTORY_URL");
const tmp = mkdtempSync(path.join(tmpdir(), "inventory-demo-"));
const wake = path.join(tmp, "wake");

function pod(name, delta, env = {}) {
  const child = spawn(process.execPath, [path.join(here, "worker.mjs")], {
    env: { ...process.env, POD: name, DELTA: String(delta), ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  let out = "";
  child.stdout.on("data", (c) => {
    out += c;
    process.stdout.write(c);
  });
  const exited = once(child, "exit").then(([code]) => code);
  const said = (text) =>
    new Promise((resolve, reject) => {
      const check = () => out.includes(text) && resolve();
      child.stdout.on("data", check);
      exited.then(() => (out.includes(text) ? resolve() : reject(new Error(`pod ${name} exited before saying ${JSON.stringify(text)}`))));
      check();
    });
  return { exited, said, output: () => out };
}

const failures = [];
try {
  const a = pod("a", 3, { STALL_UNTIL: wake });
  await a.said("stalling");
  const b = pod("b", 5);
  const bCode = await b.exited;
  if (bCode !== 0) failures.push(`pod b exited ${bCode}, want 0 (written)`);
  writeFileSync(wake, "");
  const aCode = await a.exited;
  if (aCode !== 3) failures.push(`pod a exited ${aCode}, want 3 (its stale write refused)`);
  if (!a.output().includes("lease lost")) failures.push("pod a was not told that its lease was lost");

  const { qty } = await (await fetch(`${inventory}/stock/SKU-001`)).json();
  const history = await (await fetch(`${inventory}/_history`)).json();
  console.log(`final figure: ${qty}; writes that landed: ${JSON.stringify(history)}`);
  if (qty !== 5) failures.push(`the final figure is ${qty}, want 5`);
  if (history.length !== 1 || history[0].holder !== "b") failures.push("only pod b's write may land");
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
if (failures.length) {
  console.error(`FAIL:\n  ${failures.join("\n  ")}`);
  process.exit(1);
}
console.log("PASS: the stale write was refused, pod a learned it, the figure is right");
