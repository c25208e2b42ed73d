# A stock WSGI upstream (Python's wsgiref), as CGI-style servers read
# headers: '-' and '_' both become '_' in environ, repeats are joined with
# ','. Each answer is the request's HTTP_* environ as JSON; GET /__seen
# (asked directly, not through the gateway) lists the paths it was sent.
import json
import sys
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

seen = []
lock = threading.Lock()


def app(environ, start_response):
    path = environ.get("PATH_INFO", "")
    if path == "/__seen":
        with lock:
            body = json.dumps(seen).encode()
    else:
        n = int(environ.get("CONTENT_LENGTH") or 0)
        if n:
            environ["wsgi.input"].read(n)
        with lock:
            seen.append(path)
        body = json.dumps({k: v for k, v in environ.items() if k.startswith("HTTP_")}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


srv = make_server("127.0.0.1", 0, app, handler_class=Quiet)
print(srv.server_port, flush=True)
# The test closes stdin when it is done: stop then.
threading.Thread(target=lambda: (sys.stdin.read(), srv.shutdown()), daemon=True).start()
srv.serve_forever()
