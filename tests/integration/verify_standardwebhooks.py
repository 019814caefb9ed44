#!/usr/bin/env python3
"""Standard Webhooks interop: our C signer against the OFFICIAL `standardwebhooks` package.

    verify_standardwebhooks.py --signer build/tests/integration/sl_sign_vector [--count N]

Runs sl_sign_vector (random UTF-8 bodies, 1..3 random whsec_ secrets per case, signed now
through sl_sign_headers) and, for every case, with the official PyPI library:
  * Webhook(secret).verify(body, headers) succeeds for EACH of the case's secrets;
  * each entry of webhook-signature equals Webhook(secret_i).sign(...) (same order);
  * a body with one byte more, and a secret the signer never saw, are rejected.
It also checks that our signature of the published test vector equals the official sign().

The package comes from the venv that scripts/setup.sh creates at
${SLUICE_CACHE_DIR:-$HOME/.cache/sluice}/venv. When the running interpreter lacks it, the
script re-executes itself with that venv's python; when neither has it, it FAILS (exit 1),
never skips: run scripts/setup.sh.
"""
import argparse
import base64
import json
import os
import secrets
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

SETUP_HINT = "run scripts/setup.sh (it installs standardwebhooks into ${SLUICE_CACHE_DIR:-$HOME/.cache/sluice}/venv)"


def venv_python():
    cache = os.environ.get("SLUICE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "sluice")
    return os.path.join(cache, "venv", "bin", "python")


def import_official():
    """Return the standardwebhooks module, re-exec'ing into the setup venv if needed."""
    try:
        import standardwebhooks.webhooks as swh  # noqa: PLC0415
        return swh
    except ImportError:
        pass
    py = venv_python()
    if os.environ.get("SL_SWH_REEXEC") != "1" and os.path.exists(py):
        env = dict(os.environ, SL_SWH_REEXEC="1")
        os.execve(py, [py, os.path.abspath(__file__)] + sys.argv[1:], env)
    print(f"FAIL: the official 'standardwebhooks' Python package is not installed "
          f"(looked in {sys.executable} and {py}): {SETUP_HINT}", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--signer", required=True, help="path of the sl_sign_vector program")
    ap.add_argument("--count", type=int, default=150, help="random cases (default 150)")
    args = ap.parse_args()

    swh = import_official()
    Webhook, WebhookVerificationError = swh.Webhook, swh.WebhookVerificationError
    try:
        from importlib.metadata import version
        libver = version("standardwebhooks")
    except Exception:  # noqa: BLE001 - version is informational only
        libver = "unknown"

    passed = failed = 0
    failures = []

    def check(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="sl-swh-") as tmp:
        run = subprocess.run([args.signer, "--out", tmp, "--count", str(args.count)],
                             capture_output=True, check=False)
        if run.returncode != 0:
            print(f"FAIL: {args.signer} exited {run.returncode}: {run.stderr.decode(errors='replace')}",
                  file=sys.stderr)
            return 1
        doc = json.loads(run.stdout)

        # 1. The published vector: our signature == the official library's sign().
        v = doc["vector"]
        with open(os.path.join(tmp, v["body_file"]), "rb") as f:
            vbody = f.read()
        official = Webhook(v["secret"]).sign(
            msg_id=v["msg_id"], timestamp=datetime.fromtimestamp(v["timestamp"], tz=timezone.utc),
            data=vbody.decode("utf-8"))
        check(v["signature"] == official, f"vector: ours {v['signature']!r} != official {official!r}")
        check(v["signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
              "vector: signature differs from the published value")

        # 2. Random cases.
        for i, case in enumerate(doc["cases"]):
            with open(os.path.join(tmp, case["body_file"]), "rb") as f:
                body = f.read()
            headers = dict(line.split(": ", 1) for line in case["headers"])
            check(set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"},
                  f"case {i}: header names {sorted(headers)}")
            check(headers.get("webhook-id") == case["msg_id"]
                  and headers.get("webhook-timestamp") == str(case["timestamp"]),
                  f"case {i}: id/timestamp header values")
            entries = headers.get("webhook-signature", "").split(" ")
            check(len(entries) == len(case["secrets"]),
                  f"case {i}: {len(entries)} signature entries for {len(case['secrets'])} secrets")
            when = datetime.fromtimestamp(case["timestamp"], tz=timezone.utc)
            for k, secret in enumerate(case["secrets"]):
                wh = Webhook(secret)
                try:
                    wh.verify(body, headers, json_parse=False)
                    check(True, "")
                except WebhookVerificationError as e:
                    check(False, f"case {i} secret {k}: official verify rejected: {e}")
                want = wh.sign(msg_id=case["msg_id"], timestamp=when, data=body.decode("utf-8"))
                check(k < len(entries) and entries[k] == want,
                      f"case {i} secret {k}: entry differs from official sign()")
            # Negative controls: the official library must reject these.
            try:
                Webhook(case["secrets"][0]).verify(body + b"x", headers, json_parse=False)
                check(False, f"case {i}: tampered body accepted")
            except WebhookVerificationError:
                check(True, "")
            stranger = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
            try:
                Webhook(stranger).verify(body, headers, json_parse=False)
                check(False, f"case {i}: unknown secret accepted")
            except WebhookVerificationError:
                check(True, "")

    for f in failures[:20]:
        print(f"FAIL: {f}", file=sys.stderr)
    print(f"standardwebhooks {libver} ({sys.executable}): {len(doc['cases'])} cases from {args.signer}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
