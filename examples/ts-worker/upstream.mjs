// A tiny protected "upstream" for the example: answers 200 to any request,
// logs each one (method, raw path, content type, the gateway's Fencing-*
// headers, body) and
// keeps them so the worker can check what actually landed:
//   GET /_received  -> JSON array of the requests received so far
//
//   node upstream.mjs            listens on 127.0.0.1 with a free port
//   PORT=9000 node upstream.mjs  listens on 127.0.0.1:9000
// It prints "listening on http://127.0.0.1:PORT" once ready.
import http from "node:http";

const received = [];

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    if (req.method === "GET" && req.url === "/_received") {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(received));
      return;
    }
    const body = Buffer.concat(chunks).toString("utf8");
    const rec = {
      method: req.method,
      path: req.url, // as received: percent-encoding and query included
      content_type: req.headers["content-type"] ?? null,
      fencing_token: req.headers["fencing-token"] ?? null,
      fencing_resource: req.headers["fencing-resource"] ?? null,
      // The gateway must never pass the lease secret on: recorded to check.
      fencing_lease: req.headers["fencing-lease"] ?? null,
      body,
    };
    received.push(rec);
    console.log(
      `upstream: ${rec.method} ${rec.path} type=${rec.content_type} token=${rec.fencing_token} resource=${rec.fencing_resource} body=${body}`,
    );
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ ok: true, stored: received.length }));
  });
});

server.listen(Number(process.env.PORT ?? 0), "127.0.0.1", () => {
  const { port } = server.address();
  console.log(`listening on http://127.0.0.1:${port}`);
});

for (const sig of ["SIGINT", "SIGTERM"]) {
  process.on(sig, () => server.close(() => process.exit(0)));
}
