"""Delivery to HTTPS endpoints, the common case in production.

A TLS server of the test's own (Python's http.server behind ssl, a certificate for 127.0.0.1
signed by a test CA, tests/e2e/tls_helpers.CA) stands in for the endpoint. The consumer trusts
that CA through endpoint_ca_file: the request arrives over TLS with its Standard Webhooks
headers, the signature verifies with the endpoint's secret and the outcome reports a TLS
handshake time. An endpoint whose certificate another CA signed gets no request: the handshake
fails, the outcome says `tls` and the delivery is retried. A consumer given a file with no
certificate in it refuses to start (exit 78, naming the option).
"""

import base64
import hashlib
import hmac
import http.server
import os
import ssl
import threading

from sluice_e2e import event, final_states, wait_until
from tls_helpers import CA

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))


class TlsReceiver:
    """An HTTPS server on 127.0.0.1 answering 204 to every POST; .requests holds (path,
    headers, body) of each one received."""

    def __init__(self, cert, key):
        self.requests = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                outer.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()},
                                       body))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        # the handshake runs in accept(); a client that refuses the certificate makes accept
        # raise, which the server skips
        self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True)
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path):
        return f"https://127.0.0.1:{self.port}/{path}"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def signature_ok(secret, headers, body):
    """Standard Webhooks: v1,base64(HMAC-SHA256(key, "<id>.<timestamp>.<body>"))."""
    key = base64.b64decode(secret.split("_", 1)[1])
    msg = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    want = base64.b64encode(hmac.new(key, msg, hashlib.sha256).digest()).decode()
    return any(s == f"v1,{want}" for s in headers["webhook-signature"].split())


def test_https_endpoints_trusted_through_endpoint_ca_file(make_world, tmp_path):
    ca = CA(str(tmp_path / "ca"))
    other = CA(str(tmp_path / "other"), name="other")
    good = TlsReceiver(*ca.issue("good", "127.0.0.1"))
    bad = TlsReceiver(*other.issue("bad", "127.0.0.1"))
    try:
        w = make_world(endpoint_ca_file=ca.cert, retry_base_ms=200, retry_cap_ms=400,
                       max_attempts=2)
        ok_ep = w.add_endpoint(f"tls_ok_{w.tag}", good.url("hook"))
        bad_ep = w.add_endpoint(f"tls_bad_{w.tag}", bad.url("hook"))
        evs = [event(ok_ep, i, w.tag) for i in range(5)]
        bad_evs = [event(bad_ep, i, w.tag) for i in range(2)]
        assert w.produce(evs + bad_evs).returncode == 0
        c = w.consumer()
        want = {e["id"] for e in evs}
        wait_until(lambda: {h["webhook-id"] for _, h, _ in good.requests} >= want,
                   60 * MULT, 0.2, "delivered over TLS")
        for path, headers, body in good.requests:
            assert path == "/hook"
            assert signature_ok(w.secret, headers, body), headers

        def settled():
            fin = final_states(w.outcomes())
            return all(fin.get((e["id"], bad_ep), {}).get("state") == "dead_letter"
                       for e in bad_evs) and fin
        fin = wait_until(settled, 60 * MULT, 0.5, "the untrusted endpoint's deliveries to end")
        for e in evs:
            o = fin[(e["id"], ok_ep)]
            assert o["state"] == "delivered" and o["http"] == 204, o
        outs = [o for o in w.outcomes()
                if o.get("endpoint") == ok_ep and o.get("state") == "delivered"]
        assert any(o.get("tls_us", 0) > 0 for o in outs), outs  # a handshake was timed
        bad_outs = [o for o in w.outcomes() if o.get("endpoint") == bad_ep]
        assert bad_outs and all(o.get("err") == "tls" for o in bad_outs
                                if o["state"] in ("retry_scheduled", "dead_letter")), bad_outs
        assert bad.requests == []  # not one request reached it
        assert c.term() == 0

        # a CA file without a certificate: refused at start-up, naming the option
        empty = tmp_path / "not-a-ca.pem"
        empty.write_text("not a certificate\n")
        r = w.run("consumer/sluice-consumer", "--check-config",
                  env=dict(w.env, SLUICE_ENDPOINT_CA_FILE=str(empty)))
        assert r.returncode == 78, r.stderr
        assert "SLUICE_ENDPOINT_CA_FILE" in r.stderr and "no PEM certificate" in r.stderr
    finally:
        good.close()
        bad.close()
