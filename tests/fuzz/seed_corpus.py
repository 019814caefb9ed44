#!/usr/bin/env python3
"""Seed tests/fuzz/corpus/<name>/ from schemas/fixtures (idempotent, adds files only).

    python3 tests/fuzz/seed_corpus.py          # all fixtures (a fresh corpus)
    python3 tests/fuzz/seed_corpus.py --raw    # only raw .msgpack fixtures and the jsonl lines
                                               # (after a minimising merge; see README.md)

delivery/outcome/endpoint: every JSON fixture packed to msgpack with schemas/fixtures/gen_raw.py
(the same conventions the unit test uses) plus every raw .msgpack fixture, skipping inputs
larger than 64 KiB (the fuzzing -max_len). jsonl: the lines below, each prefixed with the
options byte fuzz_jsonl.c reads first. Files are named by the SHA-1 of their content, like
libFuzzer's own corpus files, so re-running never duplicates and fuzzer finds sit alongside.
"""
import glob
import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "schemas", "fixtures"))
import gen_raw  # noqa: E402

MAX_LEN = 65536

JSONL_LINES = [
    b'{"id":"evt_42","endpoint":"shop-1","type":"order.paid","created_at_ms":1699999999999,'
    b'"content_type":"application/json","body":{"order":42,"items":[true,null,"\\u00e9"]},'
    b'"headers":{"X-Shop":"42"},"macros":{"click_id":"abc","payout":12.34,"qty":3}}\n',
    b'{"endpoint":"e","type":"t","body":"line1\\nline2 \\ud83d\\ude00 \\u0000"}',
    b'{"endpoint":"e","type":"t","body_base64":"AAEC/w=="}\r\n',
    b'{"endpoint":"e","type":"t","body_base64":"AAEC/w"}',
    b'{"endpoint":"e","type":"t","body":""}',
    b'{"endpoint":"e","type":"t","body":1.5e300}',
    b'{"endpoint":"e","type":"t","body":"x","headers":{"X-A":"v\\r\\nInjected: 1"}}',
    b'{"endpoint":"e","type":"t","body":"x","headers":{"Host":"evil"}}',
    b'{"endpoint":"e","type":"t","body":"x","macros":{"a-b":"1","c":true}}',
    b'{"endpoint":"e","endpoint":"f","type":"t","body":"x"}',
    b'{"endpiont":"e","type":"t","body":"x"}',
    b'{"endpoint":"a.b","type":"t","body":"x","id":"evt.1"}',
    b'{"endpoint":"e","type":"t","body":"x","body_base64":"eA=="}',
    b'{"endpoint":"e","type":"t","body":"x","created_at_ms":-1}',
    b'[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]',
    b'{"endpoint":"e","type":"t","body":"\xff"}',
    b'{"endpoint":"e","type":"t","body":"x"} trailing',
]


def write(name, data):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, hashlib.sha1(data).hexdigest())
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(data)
        return 1
    return 0


def main():
    raw_only = "--raw" in sys.argv[1:]
    added = {}
    for rec in ("delivery", "outcome", "endpoint"):
        n = 0
        fx = os.path.join(ROOT, "schemas", "fixtures", rec)
        for path in sorted(glob.glob(os.path.join(fx, "*", "*.json"))) if not raw_only else []:
            data = gen_raw.fixture_bytes(path)
            if len(data) <= MAX_LEN:
                n += write(rec, data)
        for path in sorted(glob.glob(os.path.join(fx, "*", "*.msgpack"))):
            with open(path, "rb") as f:
                data = f.read()
            if len(data) <= MAX_LEN:
                n += write(rec, data)
        added[rec] = n
    n = 0
    for i, line in enumerate(JSONL_LINES):
        n += write("jsonl", bytes([i % 4]) + line)
    added["jsonl"] = n
    for name, count in added.items():
        total = len(os.listdir(os.path.join(HERE, "corpus", name)))
        print(f"{name}: {count} new, {total} files")


if __name__ == "__main__":
    main()
