#!/usr/bin/env python3
"""test/fake_jwks.py: a JSON Web Key Set server on loopback, for jwt.sh.

    fake_jwks.py --file JWKS.json --path /.well-known/jwks \\
                 --port-file PORT --log HITS [--delay SECONDS]

Listens on 127.0.0.1 on a free port, which it writes to --port-file once it
accepts connections.  GET on --path answers the current content of --file
(read again for every request, so a test rotates keys by rewriting it);
any other path is 404.  Every request appends "METHOD PATH STATUS" to --log,
so a test can count fetches.  --delay holds every answer back that long
(to test the client's timeout).  Runs until it is killed.
"""
import argparse
import http.server
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", required=True)
    ap.add_argument("--path", default="/.well-known/jwks")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--delay", type=float, default=0.0)
    args = ap.parse_args()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if args.delay:
                time.sleep(args.delay)
            path = self.path.split("?", 1)[0]
            if path == args.path:
                with open(args.file, "rb") as f:
                    body = f.read()
                status = 200
                ctype = "application/json"
            else:
                body = b'{"error": "not found"}'
                status = 404
                ctype = "application/json"
            with open(args.log, "a") as log:
                log.write("GET %s %d\n" % (path, status))
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass            # the client gave up (timeout test)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # write the port atomically: the test polls for the file
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % server.server_address[1])
    os.rename(tmp, args.port_file)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
