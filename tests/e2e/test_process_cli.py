"""Command line of the long-running processes (sluice-consumer, sluice-recorder, sluice-api) and of
sluice-produce (config options spelled out, SIGINT while waiting for input): --help,
--version, an unknown argument (exit 2, named), bad configuration (exit 78 before anything
connects, the option named, its secret value never echoed), --check-config. Needs no stack."""

import os
import subprocess

import pytest

PROCS = ["consumer/sluice-consumer", "recorder/sluice-recorder"]


def run(rel, *args, env=None):
    path = os.path.join(os.environ["SL_BINARY_DIR"], rel)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    base.update(env or {})
    return subprocess.run([path, *args], env=base, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("rel", PROCS)
def test_help_version_and_unknown_argument(rel):
    name = os.path.basename(rel)
    r = run(rel, "--help")
    assert r.returncode == 0 and r.stdout.startswith(f"usage: {name}")
    r = run(rel, "--version")
    assert r.returncode == 0 and r.stdout.startswith(f"{name} ")
    r = run(rel, "--bogus")
    assert r.returncode == 2
    assert f'{name}: unknown argument "--bogus"' in r.stderr
    assert "usage:" in r.stderr


@pytest.mark.parametrize("rel", PROCS)
def test_bad_config_exits_78_naming_the_option(rel):
    secret = "pg-password-do-not-print"
    r = run(rel, env={"SLUICE_MAX_QUEUED": "1", "SLUICE_RECORDER_LANES": "0",
                      "SLUICE_PG_DSN": f"host=127.0.0.1 password={secret}"})
    assert r.returncode == 78, r.stderr
    assert "SLUICE_MAX_QUEUED" in r.stderr and "SLUICE_RECORDER_LANES" in r.stderr
    assert "master_key (SLUICE_MASTER_KEY) is required" in r.stderr
    assert "3 configuration errors, not starting" in r.stderr
    assert secret not in r.stderr + r.stdout
    # every problem at once: a refused value beside a rule across two others; a rule across
    # a refused value is left out (it would judge the default left in its place)
    r = run(rel, "--check-config", env={
        "SLUICE_MASTER_KEY": "0" * 64, "SLUICE_MAX_QUEUED": "1", "SLUICE_RETRY_BASE_MS": "5000",
        "SLUICE_RETRY_CAP_MS": "1000", "SLUICE_LEASE_MS": "x", "SLUICE_HTTP_TIMEOUT_MS": "120000",
        "SLUICE_REDIS_URL": "redis://127.0.0.1:99999/0"})
    assert r.returncode == 78, r.stderr
    assert "SLUICE_MAX_QUEUED" in r.stderr and "SLUICE_LEASE_MS" in r.stderr, r.stderr
    assert "retry_base_ms (5000) must not exceed retry_cap_ms (1000)" in r.stderr, r.stderr
    assert "lease_ms (" not in r.stderr, r.stderr
    assert "invalid value for SLUICE_REDIS_URL (env): " in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith("4 configuration errors"), r.stderr
    r = run(rel, "--check-config", env={"SLUICE_MASTER_KEY": "0" * 64})
    assert r.returncode == 0 and "configuration ok" in r.stdout


@pytest.mark.parametrize("rel", PROCS + ["api/sluice-api"])
def test_check_config_checks_the_master_key_each_needs_to_start(rel):
    """--check-config is a deployment gate: a master key missing or malformed fails it with
    78, as the start would, naming the option and the form, never echoing the value."""
    name = os.path.basename(rel)
    r = run(rel, "--check-config")
    assert r.returncode == 78 and "configuration ok" not in r.stdout, r.stdout
    assert f"{name}: master_key (SLUICE_MASTER_KEY) is required" in r.stderr, r.stderr
    r = run(rel, "--check-config", env={"SLUICE_MASTER_KEY": "not-a-key-XYZ"})
    assert r.returncode == 78, r.stdout
    assert f"{name}: invalid value for master_key: " in r.stderr, r.stderr
    assert "64 hex characters" in r.stderr and "got 13 characters" in r.stderr, r.stderr
    assert "not-a-key-XYZ" not in r.stderr + r.stdout
    r = run(rel, "--check-config", env={"SLUICE_MASTER_KEY": "ab" * 32})
    assert r.returncode == 0 and "configuration ok" in r.stdout, r.stderr


def test_config_reference_is_the_option_table():
    """docs/CONFIG.md is `sluicectl config-doc`'s output: an option added, renamed or
    re-documented in common/sl_cfg.c without regenerating the reference fails here."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = run("ctl/sluicectl", "config-doc")
    assert r.returncode == 0, r.stderr
    with open(os.path.join(repo, "docs", "CONFIG.md")) as f:
        committed = f.read()
    assert r.stdout == committed, ("docs/CONFIG.md is stale: regenerate it with "
                                   "`sluicectl config-doc > docs/CONFIG.md`")


@pytest.mark.parametrize("args,message", [
    (("topics", "ensure", "extra"), "sluicectl topics ensure: unexpected argument 'extra'"),
    (("dump", "outcomes", "extra"), "sluicectl dump: unexpected argument 'extra'"),
    (("config-doc", "extra"), "sluicectl config-doc: unexpected argument 'extra'"),
    (("endpoints", "list", "--json=s3cret"),
     "sluicectl endpoints list: option '--json' does not take a value"),
    (("dump", "outcomes", "--follow=s3cret"),
     "sluicectl dump: option '--follow' does not take a value"),
    (("topics", "ensure", "--bogus=s3cret"),
     "sluicectl topics ensure: option '--bogus' is unknown or does not take a value"),
    (("dump", "outcomes", "--max"), "sluicectl dump: option '--max' requires a value"),
    (("health", "-Z"), "sluicectl health: unknown option '-Z'"),
    (("dump", "outcomes", "--topic=s3cret", "-zP"), "sluicectl dump: unknown option '-z'"),
])
def test_sluicectl_refuses_what_it_would_ignore_naming_it(args, message):
    """sluicectl refuses extra arguments and values given to switches with exit 2 before it
    connects to anything, naming the word without its value: `topics ensure`, `dump` and
    `config-doc` ignored extra arguments, and a value given to a switch was reported as an
    unknown option '-' plus a byte of the option table."""
    r = run("ctl/sluicectl", *args, env={"SLUICE_KAFKA_BROKERS": "127.0.0.1:1"})
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    assert message in r.stderr, r.stderr
    assert "s3cret" not in r.stderr and r.stdout == ""


def test_sluice_produce_takes_config_options_only_spelled_out():
    """sluice-produce's config options are handled only when spelled out; an abbreviation is a
    usage error (exit 2) before anything is read or published. getopt accepted `--check` for
    --check-config and `--conf FILE` for --config, and the run then published every line with
    the default configuration."""
    env = {"SLUICE_KAFKA_BROKERS": "127.0.0.1:1"}
    for args in (["--check"], ["--conf", "/nonexistent.conf"], ["--print"]):
        path = os.path.join(os.environ["SL_BINARY_DIR"], "producer/sluice-produce")
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        base.update(env)
        r = subprocess.run([path, *args], env=base, input='{"not": "read"}\n',
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert "unrecognized option" in r.stderr and "published" not in r.stdout + r.stderr
    r = run("producer/sluice-produce", "--check-config", env=env)
    assert r.returncode == 0 and "configuration ok" in r.stdout, r.stderr
    r = run("producer/sluice-produce", "--config", "/nonexistent.conf", env=env)
    assert r.returncode == 78 and "/nonexistent.conf" in r.stderr


def test_sluice_produce_stops_on_sigint_while_waiting_for_input():
    """`tail -f log | sluice-produce`: SIGINT while it waits for a line stops reading, drains
    and prints the summary. The read was resumed after the signal, so the first SIGINT did
    nothing and the second killed it without a drain."""
    import signal
    import time
    path = os.path.join(os.environ["SL_BINARY_DIR"], "producer/sluice-produce")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    base["SLUICE_KAFKA_BROKERS"] = "127.0.0.1:1"
    p = subprocess.Popen([path], env=base, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1)
        assert p.poll() is None, p.stderr.read()
        p.send_signal(signal.SIGINT)
        p.wait(20)  # stdin stays open: only the signal can end the run
        p.stdin.close()
        out, err = p.stdout.read(), p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode >= 0, "killed by the signal instead of stopping"
    assert "interrupted after line 0" in err, err
    assert out.startswith("published=0 "), out



def test_a_postgresql_that_never_answers_fails_a_connect_within_seconds():
    """A PostgreSQL that accepts TCP connections and then says nothing (a dead host behind a
    load balancer, dropped packets): sluicectl's registry connection, like sluice-api's and the
    recorder's readiness check, fails within the 5 s connect timeout with the reason named. It
    waited for ever (libpq's default), and a readiness probe on the recorder's one probe thread
    with it."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)  # never accepted, never answered: the kernel completes the handshake
    try:
        port = s.getsockname()[1]
        # run() gives it 30 s: it waited for ever
        r = run("ctl/sluicectl", "endpoints", "list",
                env={"SLUICE_PG_DSN": f"postgresql://sluice@127.0.0.1:{port}/sluice"})
        assert r.returncode != 0 and "could not connect to postgresql" in r.stderr, r.stderr
        assert "timeout expired" in r.stderr, r.stderr
    finally:
        s.close()
