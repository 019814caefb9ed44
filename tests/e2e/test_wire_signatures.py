"""Requests as they cross the wire, verified with the official PyPI `standardwebhooks` library
(not Sluice's own verifier, which sluice-receiver uses): a real sluice-consumer delivers to a
capturing HTTP server on loopback that records each request's method, path, query, headers
and raw body bytes.

  * a POST whose body is binary (not UTF-8; `body_base64` in the producer's line) arrives byte
    for byte, signed over those bytes;
  * a GET postback (a --template endpoint) carries the macros percent-encoded in its path and
    query, no body, and a signature over the empty body it sends (common/sl_sign.c,
    docs/RECEIVERS.md "Affiliate postbacks"), not over the record's body;
  * after `sluicectl endpoints rotate-secret --overlap-s`, a request carries two signatures and
    each one verifies with its own secret.
"""

import base64
import http.server
import json
import os
import threading
import time
import urllib.parse

import pytest
import standardwebhooks.webhooks as swh
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from sluice_e2e import final_states, wait_until

BINARY = bytes(range(256)) + b"\xff\xfe not UTF-8 \xc3\x28 \x80\x00 end"


def new_secret():
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


class Capture:
    """A loopback HTTP/1.1 server that answers 204 to everything and records each request
    (method, target, path, query, header list, raw body bytes) in arrival order."""

    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()
        cap = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def record(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = self.read_chunked()
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = urllib.parse.urlsplit(self.path)
                with cap.lock:
                    cap.requests.append({
                        "method": self.command, "target": self.path, "path": target.path,
                        "query": target.query, "headers": list(self.headers.items()),
                        "body": body})
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def read_chunked(self):
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()

            do_GET = do_POST = do_PUT = do_PATCH = record

            def log_message(self, *args):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.srv.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.srv.server_address[1]}"
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def by_path_prefix(self, prefix):
        with self.lock:
            return [r for r in self.requests if r["path"].startswith(prefix)]

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def capture():
    c = Capture()
    yield c
    c.stop()


def headers_of(req):
    """Header name (lowercase) -> value; every name must appear once."""
    names = [k.lower() for k, _ in req["headers"]]
    dup = {n for n in names if names.count(n) > 1}
    assert not dup, f"header sent more than once: {dup}"
    return {k.lower(): v for k, v in req["headers"]}


def verifies(secret, body, headers):
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
        return True
    except WebhookVerificationError:
        return False


def check_signed_headers(h, event_id):
    assert h["webhook-id"] == event_id
    assert abs(int(h["webhook-timestamp"]) - time.time()) < 300
    entries = h["webhook-signature"].split(" ")
    assert all(e.startswith("v1,") for e in entries), entries
    return entries


def test_requests_on_the_wire_verify_with_the_official_library(make_world, capture):
    w = make_world()
    tag = w.tag
    # 1. POST, binary body
    ep_bin = w.add_endpoint("bin" + tag, capture.base + "/hooks/bin")
    # 2. GET postback: macros in the path and the query
    tpl = capture.base + "/pb/{click_id}?click_id={click_id}&payout={payout}&st={status}"
    ep_pb = w.add_endpoint("pb" + tag, tpl, "--template", "--method", "GET")
    # 3. rotation with an overlap: the previous secret keeps signing for an hour
    old, new = new_secret(), new_secret()
    ep_rot = "rot" + tag
    r = w.ctl("endpoints", "add", "--id", ep_rot, "--url", capture.base + "/hooks/rot",
              "--secret", old)
    assert r.returncode == 0, r.stderr
    r = w.ctl("endpoints", "rotate-secret", ep_rot, "--secret", new, "--overlap-s", "3600")
    assert r.returncode == 0, r.stderr

    with pytest.raises(UnicodeDecodeError):
        BINARY.decode("utf-8")  # the point of the first delivery
    macros = {"click_id": "c 1/é&=?#", "payout": "12.50", "status": "approved ü+x"}
    pb_body = {"would": "be signed if it were sent"}
    rot_body = '{"order":42,"note":"h\u00e9llo"}'
    events = [
        {"id": f"evt_{tag}_bin", "endpoint": ep_bin, "type": "blob.stored",
         "content_type": "application/octet-stream",
         "body_base64": base64.b64encode(BINARY).decode()},
        {"id": f"evt_{tag}_pb", "endpoint": ep_pb, "type": "conversion", "macros": macros,
         "body": pb_body},
        {"id": f"evt_{tag}_rot", "endpoint": ep_rot, "type": "order.created", "body": rot_body},
    ]
    r = w.produce(events)
    assert r.returncode == 0, r.stderr
    c = w.consumer()
    want = {(e["id"], e["endpoint"]) for e in events}

    def delivered():
        fin = final_states(w.outcomes())
        return all(k in fin and fin[k]["state"] == "delivered" for k in want)

    wait_until(delivered, 90, 1.0, "all three delivered")
    assert c.term() == 0, c.logs()[-3000:]
    assert len(capture.requests) == 3, [(q["method"], q["target"]) for q in capture.requests]

    # ---- 1. POST with a binary body: the exact bytes, signed over them
    (req,) = capture.by_path_prefix("/hooks/bin")
    h = headers_of(req)
    assert req["method"] == "POST" and req["query"] == ""
    assert req["body"] == BINARY, "the body on the wire differs from the record's bytes"
    assert h["content-length"] == str(len(BINARY))
    assert h["content-type"] == "application/octet-stream"
    (entry,) = check_signed_headers(h, f"evt_{tag}_bin")
    wh = Webhook(w.secret)
    try:
        wh.verify(req["body"], h, json_parse=False)
    except UnicodeDecodeError:
        # standardwebhooks 1.1.0's verify() decodes the body as UTF-8 before it signs, so it
        # cannot take a binary body at all: the same check with the library's own parts, its
        # secret decoding (Webhook._whsecret) and HMAC (hmac_data), over the raw bytes
        signed = f"{h['webhook-id']}.{h['webhook-timestamp']}.".encode() + req["body"]
        mac = swh.hmac_data(wh._whsecret, signed)
        assert entry == "v1," + base64.b64encode(mac).decode(), \
            "the binary body's signature is not HMAC-SHA256 over id.timestamp.raw-bytes"
        wrong = swh.hmac_data(Webhook(new_secret())._whsecret, signed)
        assert entry != "v1," + base64.b64encode(wrong).decode()

    # ---- 2. GET postback: macros encoded, no body, signed over the empty body
    (req,) = capture.by_path_prefix("/pb/")
    h = headers_of(req)
    assert req["method"] == "GET"
    segment = req["path"][len("/pb/"):]
    assert "/" not in segment and urllib.parse.unquote(segment) == macros["click_id"]
    q = urllib.parse.parse_qs(req["query"], keep_blank_values=True, strict_parsing=True)
    assert q == {"click_id": [macros["click_id"]], "payout": [macros["payout"]],
                 "st": [macros["status"]]}, req["target"]
    assert req["body"] == b"" and h.get("content-length", "0") == "0"
    assert "content-type" not in h and "transfer-encoding" not in h
    check_signed_headers(h, f"evt_{tag}_pb")
    Webhook(w.secret).verify(b"", h, json_parse=False)
    assert not verifies(w.secret, json.dumps(pb_body, separators=(",", ":")).encode(), h), \
        "a GET postback is signed over a body it does not send"

    # ---- 3. rotation: two signatures, each verifying with its own secret
    (req,) = capture.by_path_prefix("/hooks/rot")
    h = headers_of(req)
    assert req["method"] == "POST" and req["body"] == rot_body.encode()
    assert h["content-type"] == "application/json"
    entries = check_signed_headers(h, f"evt_{tag}_rot")
    assert len(entries) == 2, f"{len(entries)} signatures during the overlap: {entries}"
    for secret in (old, new):  # a receiver holding either secret verifies the request
        assert Webhook(secret).verify(req["body"], h) == json.loads(rot_body)
    owners = []
    for e in entries:  # and each signature is one secret's
        only = dict(h, **{"webhook-signature": e})
        owners.append([name for name, s in (("old", old), ("new", new))
                       if verifies(s, req["body"], only)])
    assert sorted(map(tuple, owners)) == [("new",), ("old",)], owners
    assert not verifies(new_secret(), req["body"], h), "a secret never used verified"
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(req["body"] + b" ", h)
