"""`sluicectl keys create|list|revoke` (API keys of sluice-api) against the real PostgreSQL:
create prints a well-formed key once, whose secret hashes (SHA-256 of the base64url-decoded
32 bytes) to exactly what the table stores; list never prints a key, a secret or a hash;
revoke marks the key (idempotent) and list leaves it out unless --all. Usage errors exit 2
naming the flag, before any configuration or database is touched.

Isolation: a private database on the shared PostgreSQL (SLUICE_PG_DSN) with every migration
of sql/ applied, so `keys list` sees only this test's keys; dropped at the end.
"""

import base64
import hashlib
import json
import os
import re
import subprocess

import pytest

from sluice_e2e import need_env, psql, rand_suffix

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SQL_DIR = os.path.join(REPO, "sql")
KEY_RE = re.compile(r"^slk_([a-z0-9]{16})_([A-Za-z0-9_-]{43})$")


def dsn_with_db(dsn, db):
    parts = [p for p in dsn.split() if not p.startswith("dbname=")]
    return " ".join(parts + [f"dbname={db}"])


def sluicectl(*args, dsn=None):
    path = os.path.join(os.environ["SL_BINARY_DIR"], "ctl", "sluicectl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    if dsn:
        env["SLUICE_PG_DSN"] = dsn
    return subprocess.run([path, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def db():
    base = need_env("SLUICE_PG_DSN")
    name = "sluice_keys_" + rand_suffix()
    admin = dsn_with_db(base, "postgres")
    psql(admin, f"create database {name}")
    dsn = dsn_with_db(base, name)
    try:
        for f in sorted(os.listdir(SQL_DIR)):
            if re.match(r"^\d{4}_.*\.sql$", f):
                r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-1", dsn,
                                    "-f", os.path.join(SQL_DIR, f)],
                                   capture_output=True, text=True, timeout=120,
                                   env={**os.environ,
                                        "PGOPTIONS": "-c client_min_messages=warning"})
                assert r.returncode == 0, f"migration {f} failed: {r.stderr}"
        yield dsn
    finally:
        psql(admin, f"drop database if exists {name} with (force)")


def secret_hash(secret):
    raw = base64.urlsafe_b64decode(secret + "=")
    assert len(raw) == 32
    # canonical: re-encoding gives the same text
    assert base64.urlsafe_b64encode(raw).decode().rstrip("=") == secret
    return hashlib.sha256(raw).hexdigest()


def test_create_list_revoke(db):
    # --json: every field, the key once
    r = sluicectl("keys", "create", "--name", "e2e publisher", "--scopes", "publish,read",
                  "--channels", "orders,billing.eu:v2", "--rate", "5", "--burst", "10", "--json",
                  dsn=db)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    m = KEY_RE.match(j["key"])
    assert m, "malformed key"
    kid, secret = m.group(1), m.group(2)
    assert j["id"] == kid and j["name"] == "e2e publisher"
    assert j["scopes"] == ["publish", "read"] and j["channels"] == ["orders", "billing.eu:v2"]
    assert j["rate_per_s"] == 5 and j["burst"] == 10
    assert secret not in r.stderr
    stored = psql(db, f"select encode(hash, 'hex') from api_keys where id = '{kid}'")
    assert stored == secret_hash(secret)
    assert psql(db, f"select array_to_string(scopes, ',') || ' ' || array_to_string(channels, ',')"
                    f" from api_keys where id = '{kid}'") == "publish,read orders,billing.eu:v2"

    # text: the "api key  slk_..." line and the shown-once note
    r = sluicectl("keys", "create", "--name", "admin tool", "--scopes", "admin", dsn=db)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("api key  ")]
    assert len(lines) == 1
    m2 = KEY_RE.match(lines[0][len("api key  "):])
    assert m2, "malformed key"
    kid2, secret2 = m2.group(1), m2.group(2)
    assert "shown only this once" in r.stdout
    assert r.stdout.count(secret2) == 1
    assert psql(db, f"select encode(hash, 'hex') from api_keys where id = '{kid2}'") == \
        secret_hash(secret2)
    hashes = psql(db, "select encode(hash, 'hex') from api_keys").split()

    # list, text and JSON: both keys, never a key, secret or hash
    for args in (("keys", "list"), ("keys", "list", "--json"), ("keys", "list", "--all"),
                 ("keys", "list", "--all", "--json")):
        r = sluicectl(*args, dsn=db)
        assert r.returncode == 0, r.stderr
        out = r.stdout + r.stderr
        assert kid in out and kid2 in out
        assert "slk_" not in out and secret not in out and secret2 not in out
        for h in hashes:
            assert h not in out
    listed = json.loads(sluicectl("keys", "list", "--json", dsn=db).stdout)
    assert [k["id"] for k in listed] == [kid, kid2]  # by creation
    assert listed[0]["active"] is True and listed[0]["revoked"] is None
    assert listed[1]["scopes"] == ["admin"] and listed[1]["channels"] == []

    # revoke: marked, left out of the active list, idempotent
    r = sluicectl("keys", "revoke", kid, dsn=db)
    assert r.returncode == 0, r.stderr
    assert f"api key {kid} revoked" in r.stdout
    assert psql(db, f"select revoked_at is not null from api_keys where id = '{kid}'") == "t"
    listed = json.loads(sluicectl("keys", "list", "--json", dsn=db).stdout)
    assert [k["id"] for k in listed] == [kid2]
    listed = json.loads(sluicectl("keys", "list", "--all", "--json", dsn=db).stdout)
    gone = [k for k in listed if k["id"] == kid][0]
    assert gone["active"] is False and gone["revoked"]
    r = sluicectl("keys", "revoke", kid, "--json", dsn=db)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"id": kid, "revoked": True, "changed": False}

    # unknown key: the operation fails (1); a malformed id is a usage error (2)
    r = sluicectl("keys", "revoke", "zzzzzzzzzzzzzzzz", dsn=db)
    assert r.returncode == 1 and "does not exist" in r.stderr
    r = sluicectl("keys", "revoke", "not-an-id", dsn=db)
    assert r.returncode == 2 and "invalid api key id" in r.stderr


@pytest.mark.parametrize("args,flag", [
    (("keys", "create", "--scopes", "read"), "--name"),
    (("keys", "create", "--name", "x"), "--scopes"),
    (("keys", "create", "--name", "x", "--scopes", "write"), "--scopes"),
    (("keys", "create", "--name", "x", "--scopes", ""), "--scopes"),
    (("keys", "create", "--name", "x", "--scopes", "read", "--channels", "a b"), "--channels"),
    (("keys", "create", "--name", "x", "--scopes", "read", "--rate", "-1"), "--rate"),
    (("keys", "create", "--name", "x", "--scopes", "read", "--burst", "5"), "--burst"),
    (("keys", "create", "--name", "x", "--scopes", "read", "--rate"), "--rate"),
    (("keys", "list", "--bogus"), "--bogus"),
    (("keys", "revoke"), "api key id"),
    (("keys", "revoke", "a", "b"), "unexpected argument"),
    (("keys", "frob"), "frob"),
])
def test_usage_errors_exit_2_naming_the_flag(args, flag):
    # no configuration at all: usage errors come first
    r = sluicectl(*args)
    assert r.returncode == 2, r.stderr
    assert flag in r.stderr
    assert r.stdout == ""


def test_help():
    r = sluicectl("keys", "--help")
    assert r.returncode == 0
    for word in ("keys create", "keys list", "keys revoke", "--scopes", "--channels", "--all"):
        assert word in r.stdout
    r = sluicectl("keys", "create", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage:")
    r = sluicectl("--help")
    assert r.returncode == 0 and "keys" in r.stdout
