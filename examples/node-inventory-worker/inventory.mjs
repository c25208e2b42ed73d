// The inventory service the pods update: a stock figure per SKU, in memory.
// It trusts whoever calls it, as most services do; fencegw stands in front.
//
//   GET  /stock/{sku}   -> {"sku", "qty"}
//   PUT  /stock/{sku}   {"qty": N} sets the figure (and records who wrote it)
//   GET  /_history      -> every PUT that landed, with its Fencing-Token
//
//   node inventory.mjs            listens on 127.0.0.1, a free port (PORT= to choose)
// It prints "listening on http://127.0.0.1:PORT" once ready.
import http from "node:http";

const stock = new Map([["SKU-001", 10]]);
const history = [];

function answer(res, status, body) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const url = new URL(req.url, "http://inventory");
    if (req.method === "GET" && url.pathname === "/_history") return answer(res, 200, history);
    const m = /^\/stock\/([^/]+)$/.exec(url.pathname);
    if (!m) return answer(res, 404, { error: "no such path" });
    const sku = decodeURIComponent(m[1]);
    if (req.method === "GET") return answer(res, 200, { sku, qty: stock.get(sku) ?? 0 });
    if (req.method === "PUT") {
      const { qty } = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      stock.set(sku, qty);
      const rec = { sku, qty, token: Number(req.headers["fencing-token"] ?? 0), holder: req.headers["x-pod"] ?? null };
      history.push(rec);
      console.log(`inventory: ${sku} := ${qty} (pod ${rec.holder}, token ${rec.token})`);
      return answer(res, 200, { sku, qty });
    }
    answer(res, 405, { error: "method not allowed" });
  });
});

server.listen(Number(process.env.PORT ?? 0), "127.0.0.1", () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => server.close(() => process.exit(0)));
