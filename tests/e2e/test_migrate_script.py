"""scripts/migrate.sh: the one way sql/ is applied (by operators, scripts/stack.sh, the tests'
private databases and bench/recorder.sh).

On an empty database two runs at once apply every migration exactly once, in order, each with
its schema_migrations row; a run on an up-to-date database applies nothing; a migration that
fails is rolled back with its row and named, exit 1; a migration whose file changed after it
was applied is reported, not applied again; --status lists each one's state. The DSN, which
may hold a password, is never printed.
"""
import os
import shutil
import subprocess

from sluice_e2e import MIGRATE, SQL_DIR, dsn_with_db, need_env, psql, rand_suffix

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))


def migrate(dsn, *args, sql_dir=SQL_DIR):
    return subprocess.Popen(["bash", MIGRATE, *args, dsn], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "SLUICE_SQL_DIR": sql_dir})


def finish(p):
    out, _ = p.communicate(timeout=300 * MULT)
    return p.returncode, out


def test_migrations_apply_once_in_order_and_a_failed_one_is_rolled_back(tmp_path):
    base = need_env("SLUICE_PG_DSN")
    admin = dsn_with_db(base, "postgres")
    name = "sluice_migrate_" + rand_suffix()
    psql(admin, f"create database {name}")
    dsn = dsn_with_db(base, name) + " password=NOT_PRINTED_pw"  # trust auth ignores it
    try:
        files = sorted(f for f in os.listdir(SQL_DIR) if f[:4].isdigit() and f.endswith(".sql"))
        a, b = migrate(dsn), migrate(dsn)  # at once
        (rca, outa), (rcb, outb) = finish(a), finish(b)
        assert rca == 0 and rcb == 0, outa + outb
        applied = [line.split()[-1] for line in (outa + outb).splitlines()
                   if line.startswith("[migrate] applied ")]
        assert sorted(applied) == files, f"applied {applied}, expected each of {files} once"
        rows = psql(dsn, "select version from schema_migrations order by applied_at, version")
        assert rows.split("\n") == files, "not applied in file-name order"
        assert "NOT_PRINTED" not in outa + outb

        rc, out = finish(migrate(dsn))
        assert rc == 0 and "0 applied now" in out, out

        # a changed file is reported; a failing one rolls back with its row
        sql = tmp_path / "sql"
        shutil.copytree(SQL_DIR, sql)
        with open(sql / files[0], "a") as f:
            f.write("-- changed\n")
        (sql / "9998_ok.sql").write_text("create table migrate_ok (a int);\n")
        (sql / "9999_bad.sql").write_text("create table migrate_bad (a int);\nselect 1/0;\n")
        rc, out = finish(migrate(dsn, sql_dir=str(sql)))
        assert rc == 1, out
        assert f"migration {files[0]} changed after it was applied" in out, out
        assert "applied 9998_ok.sql" in out and "migration 9999_bad.sql failed" in out, out
        assert "division by zero" in out, out
        assert psql(dsn, "select to_regclass('migrate_ok') is not null, "
                         "to_regclass('migrate_bad') is null") == "t|t"
        assert psql(dsn, "select count(*) from schema_migrations where version like '9999%'") \
            == "0"
        rc, out = finish(migrate(dsn, "--status", sql_dir=str(sql)))
        assert rc == 0, out
        assert f"[migrate] {files[0]}: applied, file changed since" in out, out
        assert "[migrate] 9998_ok.sql: applied" in out, out
        assert "[migrate] 9999_bad.sql: pending" in out, out
    finally:
        psql(admin, f"drop database if exists {name} with (force)")


def test_a_database_made_without_the_script_is_baselined_then_migrated(tmp_path):
    """sql/ applied by hand (as compose.yaml's PostgreSQL once did through
    docker-entrypoint-initdb.d): a plain run refuses and names --baseline instead of failing
    half-way through 0001; --baseline VERSION records the migrations up to VERSION without
    running them, only while schema_migrations is empty; later migrations then apply."""
    base = need_env("SLUICE_PG_DSN")
    admin = dsn_with_db(base, "postgres")
    name = "sluice_baseline_" + rand_suffix()
    psql(admin, f"create database {name}")
    dsn = dsn_with_db(base, name)
    try:
        files = sorted(f for f in os.listdir(SQL_DIR) if f[:4].isdigit() and f.endswith(".sql"))
        for f in files:
            subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", dsn, "-f",
                            os.path.join(SQL_DIR, f)], check=True, capture_output=True)
        rc, out = finish(migrate(dsn))
        assert rc == 1 and "--baseline VERSION" in out and "no schema_migrations rows" in out, out
        assert psql(dsn, "select count(*) from schema_migrations") == "0"

        rc, out = finish(migrate(dsn, "--baseline", "0000_none.sql"))
        assert rc == 1 and "no migration 0000_none.sql" in out, out

        sql = tmp_path / "sql"
        shutil.copytree(SQL_DIR, sql)
        (sql / "9998_next.sql").write_text("create table migrate_next (a int);\n")
        rc, out = finish(migrate(dsn, "--baseline", files[-1], sql_dir=str(sql)))
        assert rc == 0 and f"{len(files)} migrations up to {files[-1]} recorded" in out, out
        assert psql(dsn, "select string_agg(version, ',' order by version) "
                         "from schema_migrations") == ",".join(files)
        assert psql(dsn, "select to_regclass('migrate_next') is null") == "t"

        rc, out = finish(migrate(dsn, "--baseline", files[-1], sql_dir=str(sql)))
        assert rc == 1 and "already has rows" in out, out

        rc, out = finish(migrate(dsn, sql_dir=str(sql)))
        assert rc == 0 and "applied 9998_next.sql" in out and "1 applied now" in out, out
        assert "changed after" not in out, out  # the recorded checksums are the files'
        assert psql(dsn, "select to_regclass('migrate_next') is not null") == "t"
    finally:
        psql(admin, f"drop database if exists {name} with (force)")
