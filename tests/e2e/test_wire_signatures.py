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

Ed25519 (Standard Webhooks `v1a`, `--signature ed25519`): the official libraries do not verify
v1a yet, so every captured v1a entry is checked with the `cryptography` package's Ed25519
(`Ed25519PublicKey.from_public_bytes(...).verify`) against the `whpk_` public key sluicectl
printed, an implementation independent of Sluice's:

  * an endpoint created with --signature ed25519 and rotated to a second Ed25519 key (two v1a
    entries, each verifying with its own public key only), with a binary body;
  * an HMAC endpoint rotated to Ed25519 (a v1a and a v1 entry side by side: the official
    library verifies the v1 one with the old whsec_, cryptography the v1a one);
  * sluice-receiver given the whsk_ key verifies v1a with Sluice's own sl_verify();
  * `endpoints show` prints the public keys without --show-secrets (and says it needs
    master_key without one); no whsk_ private key reaches a log.
"""

import base64
import http.server
import json
import os
import re
import threading
import time
import urllib.parse

import pytest
import standardwebhooks.webhooks as swh
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (Ed25519PrivateKey,
                                                               Ed25519PublicKey)
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from sluice_e2e import final_states, wait_until

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))
BINARY = bytes(range(256)) + b"\xff\xfe not UTF-8 \xc3\x28 \x80\x00 end"


def new_secret():
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


class Capture:
    """A loopback HTTP/1.1 server that answers 204 to everything (the first request `first`,
    (status, {header: value}), when given) and records each request (method, target, path,
    query, header list, raw body bytes) in arrival order."""

    def __init__(self, first=None):
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
                    n = len(cap.requests)
                status, extra = first if first and n == 1 else (204, {})
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
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



def deliver_all(w, events):
    """Produce events, run a consumer until every one is delivered, stop it (exit 0); the
    stopped consumer (its logs)."""
    r = w.produce(events)
    assert r.returncode == 0, r.stderr
    c = w.consumer()
    want = {(e["id"], e["endpoint"]) for e in events}

    def delivered():
        fin = final_states(w.outcomes())
        return all(k in fin and fin[k]["state"] == "delivered" for k in want)

    wait_until(delivered, 90, 1.0, f"all {len(want)} delivered")
    assert c.term() == 0, c.logs()[-3000:]
    return c

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
    deliver_all(w, events)
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


def api_call(api, method, path, body, key):
    """One JSON request to sluice-api: (status, parsed answer)."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    c.request(method, path, body=json.dumps(body),
              headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    r = c.getresponse()
    text = r.read()
    c.close()
    return r.status, json.loads(text) if text else None


def test_events_published_through_the_api_cross_the_wire_as_posted(make_world, capture):
    """The API's publish fields, end to end: endpoints made over the API (an extra header
    holding a credential, a URL query token, a GET postback template), a `body_base64` event
    with its `content_type` and event headers to an explicit endpoint, and a fan-out event
    whose macros fill the postback. On the wire: the exact bytes and headers, the macros
    percent-encoded, each signature verifying with the secret the API returned once. And none
    of the credentials, macro values, body bytes or keys in sluice-api's or the consumer's log,
    both at log_level=debug with every debug context on."""
    w = make_world()
    tag = w.tag
    hsecret, qsecret = "Hdr" + os.urandom(8).hex(), "Qry" + os.urandom(8).hex()
    core = os.urandom(6).hex()  # the macro's random part: found in a log however encoded
    note, click = "Note" + os.urandom(8).hex(), "clk " + core + "/é&=?#"
    admin, pub = w.api_key("admin"), w.api_key("publish")
    api = w.api(log_level="debug", debug="all")
    st, b = api_call(api, "POST", "/v1/endpoints",
                     {"id": "apibin" + tag, "url": capture.base + f"/hooks/apibin?tok={qsecret}",
                      "headers": {"X-Api-Token": hsecret}, "types": ["blob.*"]}, admin)
    assert st == 201 and b["secret"].startswith("whsec_"), b
    bin_secret = b["secret"]
    st, b = api_call(api, "POST", "/v1/endpoints",
                     {"id": "apipb" + tag, "url": capture.base + "/pb/{click_id}?payout={payout}",
                      "template": True, "method": "GET", "types": [f"conv{tag}.*"]}, admin)
    assert st == 201, b
    pb_secret = b["secret"]
    c = w.consumer(log_level="debug", debug="all")
    ev_bin = {"type": "blob.stored", "endpoint": "apibin" + tag,
              "content_type": "application/octet-stream",
              "body_base64": base64.b64encode(BINARY).decode(), "headers": {"X-Event-Note": note}}
    got = {}

    def published():  # sluice-api sees a new endpoint a moment after it made it
        got["bin"] = api_call(api, "POST", "/v1/events", ev_bin, pub)
        return got["bin"][0] == 202
    wait_until(published, 30 * MULT, 0.2, "sluice-api to know the new endpoint")
    bin_id = got["bin"][1]["id"]
    st, b = api_call(api, "POST", "/v1/events",
                     {"type": f"conv{tag}.approved", "body": {"n": 1},
                      "macros": {"click_id": click, "payout": "12.50"}}, pub)
    assert st == 202 and b["endpoints"] == ["apipb" + tag], b
    pb_id = b["id"]
    wait_until(lambda: len(capture.requests) >= 2, 90 * MULT, 0.5, "both deliveries")
    time.sleep(1.0)
    assert len(capture.requests) == 2, [(q["method"], q["target"]) for q in capture.requests]

    (req,) = capture.by_path_prefix("/hooks/apibin")
    h = headers_of(req)
    assert req["method"] == "POST" and req["query"] == f"tok={qsecret}"
    assert req["body"] == BINARY and h["content-type"] == "application/octet-stream"
    assert h["x-api-token"] == hsecret and h["x-event-note"] == note, h
    (entry,) = check_signed_headers(h, bin_id)
    signed = f"{h['webhook-id']}.{h['webhook-timestamp']}.".encode() + req["body"]
    mac = swh.hmac_data(Webhook(bin_secret)._whsecret, signed)
    assert entry == "v1," + base64.b64encode(mac).decode()

    (req,) = capture.by_path_prefix("/pb/")
    h = headers_of(req)
    assert req["method"] == "GET" and req["body"] == b""
    assert urllib.parse.unquote(req["path"][len("/pb/"):]) == click
    assert urllib.parse.parse_qs(req["query"], strict_parsing=True) == {"payout": ["12.50"]}
    check_signed_headers(h, pb_id)
    Webhook(pb_secret).verify(b"", h, json_parse=False)
    assert not verifies(bin_secret, b"", h)

    assert c.term() == 0
    assert api.proc.term() == 0
    logs = api.proc.logs() + c.logs()
    # the logs do speak of these endpoints (their ids), only never of their secrets
    assert "apibin" + tag in logs and "apipb" + tag in logs, "nothing to check"
    for what, text in (("an endpoint header value", hsecret), ("a URL query value", qsecret),
                       ("an event header value", note), ("a macro value", click),
                       ("a macro value (its random part)", core),
                       ("a signing secret", bin_secret), ("a signing secret", pb_secret),
                       ("an API key", admin), ("an API key", pub),
                       ("the body", base64.b64encode(BINARY).decode()[:40])):
        assert text not in logs, f"{what} reached a log line"


# ==== Ed25519 (v1a) ====

WHPK = re.compile(r"^whpk_[A-Za-z0-9+/]{43}=$")
WHSK = re.compile(r"^whsk_[A-Za-z0-9+/]{86}==$")


def v1a_verifies(whpk, entry, signed):
    """Does the v1a entry ("v1a,<b64>") verify `signed` under the whpk_ public key? Checked with
    the `cryptography` package only (not Sluice's code)."""
    version, _, sig = entry.partition(",")
    assert version == "v1a", entry
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(whpk[len("whpk_"):], validate=True))
    try:
        key.verify(base64.b64decode(sig, validate=True), signed)
        return True
    except InvalidSignature:
        return False


def check_whsk(whsk, whpk):
    """The whsk_ layout (Svix's): base64 of seed || public key; the public half and the whpk_
    are the seed's public key as `cryptography` derives it."""
    assert WHSK.match(whsk) and WHPK.match(whpk), (len(whsk), whpk)
    raw = base64.b64decode(whsk[len("whsk_"):], validate=True)
    assert len(raw) == 64
    pub = Ed25519PrivateKey.from_private_bytes(raw[:32]).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert raw[32:] == pub
    assert base64.b64decode(whpk[len("whpk_"):]) == pub


def text_field(out, label):
    """The value of a `label   value` row of sluicectl's text output."""
    m = re.search(rf"^{re.escape(label)}\s+(\S+)$", out, re.M)
    assert m, f"no '{label}' row in:\n{out}"
    return m.group(1)


def test_v1a_signatures_verify_with_the_printed_public_key(make_world, capture):
    w = make_world()
    tag = w.tag
    # A: created Ed25519 (JSON), then rotated to a second Ed25519 key (text) with an overlap;
    #    rotate-secret without --signature keeps the current secret's scheme
    ep_a = "eda" + tag
    r = w.ctl("endpoints", "add", "--id", ep_a, "--url", capture.base + "/hooks/eda",
              "--signature", "ed25519", "--json")
    assert r.returncode == 0, r.stderr
    added = json.loads(r.stdout)
    whsk_a1, pk_a1 = added["secret"], added["public_key"]
    check_whsk(whsk_a1, pk_a1)
    assert [(s["signature"], s["public_key"]) for s in added["secrets"]] == [("ed25519", pk_a1)]
    r = w.ctl("endpoints", "rotate-secret", ep_a, "--overlap-s", "3600")
    assert r.returncode == 0, r.stderr
    whsk_a2, pk_a2 = text_field(r.stdout, "signing secret"), text_field(r.stdout, "public key")
    check_whsk(whsk_a2, pk_a2)
    assert pk_a2 != pk_a1
    # B: an HMAC endpoint (a known whsec_) rotated to Ed25519 (JSON) with an overlap
    ep_b, secret_b = "edb" + tag, new_secret()
    r = w.ctl("endpoints", "add", "--id", ep_b, "--url", capture.base + "/hooks/edb", "--secret",
              secret_b)
    assert r.returncode == 0, r.stderr
    assert "public key" not in r.stdout  # an HMAC secret has none
    r = w.ctl("endpoints", "rotate-secret", ep_b, "--signature", "ed25519", "--overlap-s", "3600",
              "--json")
    assert r.returncode == 0, r.stderr
    rot = json.loads(r.stdout)
    whsk_b, pk_b = rot["secret"], rot["public_key"]
    check_whsk(whsk_b, pk_b)
    # C: sluice-receiver holding the whsk_ verifies v1a with Sluice's own sl_verify()
    whsk_c = "whsk_" + base64.b64encode(
        (lambda k: k.private_bytes_raw() + k.public_key().public_bytes_raw())(
            Ed25519PrivateKey.generate())).decode()
    rcv = w.receiver(secrets_list=[whsk_c], extra=["--reject-bad-sig"])
    ep_c = "edc" + tag
    r = w.ctl("endpoints", "add", "--id", ep_c, "--url", rcv.url("ok", ep_c), "--secret", whsk_c)
    assert r.returncode == 0, r.stderr
    pk_c = text_field(r.stdout, "public key")
    check_whsk(whsk_c, pk_c)
    # a --secret whose public half is another key's is refused, and not echoed
    forged = "whsk_" + base64.b64encode(
        base64.b64decode(whsk_c[5:])[:32] + base64.b64decode(pk_a1[5:])).decode()
    r = w.ctl("endpoints", "add", "--id", "edx" + tag, "--url", capture.base + "/x", "--secret",
              forged)
    assert r.returncode == 2 and "public half does not match" in r.stderr, r.stderr
    assert forged[5:30] not in r.stderr + r.stdout

    # `show`: the public keys without --show-secrets, never the private keys
    r = w.ctl("endpoints", "show", ep_a)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("public key: ") == 2, r.stdout
    assert f"public key: {pk_a2}" in r.stdout and f"public key: {pk_a1}" in r.stdout
    assert r.stdout.index(pk_a2) < r.stdout.index(pk_a1), "current secret first"
    assert "whsk_" not in r.stdout
    r = w.ctl("endpoints", "show", ep_b, "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert [(s["signature"], s["public_key"]) for s in shown["secrets"]] == \
        [("ed25519", pk_b), ("hmac", None)]
    assert "whsk_" not in r.stdout and "whsec_" not in r.stdout
    no_mk = {k: v for k, v in w.env.items() if k != "SLUICE_MASTER_KEY"}
    r = w.ctl("endpoints", "show", ep_a, env=no_mk)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^public key\s+\(needs master_key\)$", r.stdout, re.M), r.stdout
    assert "whpk_" not in r.stdout

    rot_body = '{"order":7,"note":"ed25519 \u00e9"}'
    events = [
        {"id": f"evt_{tag}_a", "endpoint": ep_a, "type": "blob.stored",
         "content_type": "application/octet-stream",
         "body_base64": base64.b64encode(BINARY).decode()},
        {"id": f"evt_{tag}_b", "endpoint": ep_b, "type": "order.created", "body": rot_body},
        {"id": f"evt_{tag}_c", "endpoint": ep_c, "type": "order.created", "body": {"n": 3}},
    ]
    c = deliver_all(w, events)
    logs = c.logs()
    for whsk in (whsk_a1, whsk_a2, whsk_b, whsk_c):
        assert whsk[5:40] not in logs, "an Ed25519 private key reached the consumer's log"

    # ---- A: two v1a entries (current key first), each its own key's, over the raw bytes
    (req,) = capture.by_path_prefix("/hooks/eda")
    h = headers_of(req)
    assert req["body"] == BINARY
    assert h["webhook-id"] == f"evt_{tag}_a"
    assert abs(int(h["webhook-timestamp"]) - time.time()) < 300
    entries = h["webhook-signature"].split(" ")
    assert [e.split(",")[0] for e in entries] == ["v1a", "v1a"], entries
    assert all(len(e) == 4 + 88 for e in entries), entries
    signed = f"{h['webhook-id']}.{h['webhook-timestamp']}.".encode() + req["body"]
    assert v1a_verifies(pk_a2, entries[0], signed) and not v1a_verifies(pk_a1, entries[0], signed)
    assert v1a_verifies(pk_a1, entries[1], signed) and not v1a_verifies(pk_a2, entries[1], signed)
    assert not v1a_verifies(pk_b, entries[0], signed), "a key never used verified"
    # any change to the signed parts breaks it
    for bad in (f"{h['webhook-id']}x.{h['webhook-timestamp']}.".encode() + req["body"],
                f"{h['webhook-id']}.{int(h['webhook-timestamp']) + 1}.".encode() + req["body"],
                signed[:-1] + bytes([signed[-1] ^ 1]),
                signed + b" "):
        assert not v1a_verifies(pk_a2, entries[0], bad)
    raw = bytearray(base64.b64decode(entries[0][4:]))
    raw[10] ^= 0x04
    assert not v1a_verifies(pk_a2, "v1a," + base64.b64encode(bytes(raw)).decode(), signed)

    # ---- B: v1a (the new, current Ed25519 key) then v1 (the old whsec_), side by side
    (req,) = capture.by_path_prefix("/hooks/edb")
    h = headers_of(req)
    assert req["body"] == rot_body.encode()
    entries = h["webhook-signature"].split(" ")
    assert [e.split(",")[0] for e in entries] == ["v1a", "v1"], entries
    signed = f"{h['webhook-id']}.{h['webhook-timestamp']}.".encode() + req["body"]
    assert v1a_verifies(pk_b, entries[0], signed)
    # the official library verifies the v1 entry with the old secret, ignoring v1a
    assert Webhook(secret_b).verify(req["body"], h) == json.loads(rot_body)
    only_v1a = dict(h, **{"webhook-signature": entries[0]})
    assert not verifies(secret_b, req["body"], only_v1a)

    # ---- C: sluice-receiver (sl_verify with the whsk_ key) accepted it as signed
    wait_until(lambda: any(x["endpoint"] == ep_c for x in rcv.ledger()), 10, 0.1,
               "receiver ledger line")
    (line,) = [x for x in rcv.ledger() if x["endpoint"] == ep_c]
    assert line["sig_ok"] is True and line["status"] == 204, line


def test_rotate_without_signature_refuses_to_guess_the_scheme(make_world):
    """rotate-secret without --signature keeps the current secret's scheme; when the master
    key in use cannot open that secret, it stops (exit 1, nothing changed) instead of making
    an HMAC secret for an Ed25519 endpoint, whose receivers hold only its public key."""
    w = make_world()
    ep = "edg" + w.tag
    r = w.ctl("endpoints", "add", "--id", ep, "--url", "http://127.0.0.1:9/x",
              "--signature", "ed25519", "--json")
    assert r.returncode == 0, r.stderr
    other = dict(w.env, SLUICE_MASTER_KEY="ab" * 32)
    r = w.ctl("endpoints", "rotate-secret", ep, env=other)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "cannot tell the scheme" in r.stderr and "--signature" in r.stderr, r.stderr
    r = w.ctl("endpoints", "show", ep, "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)["secrets"]) == 1, r.stdout
    # rotated with no overlap: the previous secret is listed as expired, with its scheme and
    # public key like the others (a receiver may still ask which key it was), not its text
    r = w.ctl("endpoints", "rotate-secret", ep, "--overlap-s", "0")
    assert r.returncode == 0, r.stderr
    r = w.ctl("endpoints", "show", ep, "--json", "--show-secrets")
    assert r.returncode == 0, r.stderr
    secrets = json.loads(r.stdout)["secrets"]
    (old,) = [s for s in secrets if s["state"] == "expired"]
    assert old["signature"] == "ed25519" and old["public_key"].startswith("whpk_"), old
    assert "secret" not in old, old


def test_a_job_held_past_its_secrets_overlap_is_signed_without_the_expired_secret(make_world):
    """A rotation's previous secret signs only during the overlap. A job taken in while both
    signed, then held in memory behind a Retry-After pause until the overlap is over, goes out
    signed with the new secret alone (the expired one was still on it: the signer was
    rebuilt only when the registry changed or a new record came in)."""
    cap = Capture(first=(429, {"Retry-After": "12"}))
    try:
        w = make_world()
        ep = "hold" + w.tag
        old, new = new_secret(), new_secret()
        r = w.ctl("endpoints", "add", "--id", ep, "--url", cap.base + "/hooks/hold",
                  "--secret", old)
        assert r.returncode == 0, r.stderr
        r = w.ctl("endpoints", "rotate-secret", ep, "--secret", new, "--overlap-s", "8")
        assert r.returncode == 0, r.stderr
        t_rot = time.monotonic()
        first = {"id": f"evt_{w.tag}_a", "endpoint": ep, "type": "t", "body": {"n": 1}}
        assert w.produce([first]).returncode == 0
        c = w.consumer()
        wait_until(lambda: cap.requests, 60, 0.1, "the first request (answered 429)")
        held = {"id": f"evt_{w.tag}_b", "endpoint": ep, "type": "t", "body": {"n": 2}}
        assert w.produce([held]).returncode == 0
        wait_until(lambda: any(q["body"] == b'{"n":2}' for q in cap.requests), 60, 0.2,
                   "the held job sent once the pause is over")
        assert time.monotonic() - t_rot > 8, "sent before the overlap ended"
        (req,) = [q for q in cap.requests if q["body"] == b'{"n":2}']
        h = headers_of(req)
        sigs = h["webhook-signature"].split(" ")
        assert len(sigs) == 1, sigs
        Webhook(new).verify(req["body"], h, json_parse=False)  # the new secret's
        assert c.term() == 0
    finally:
        cap.stop()

