#!/usr/bin/env bash
# Apply Sluice's PostgreSQL migrations (sql/NNNN_*.sql) to a database: each pending one once,
# in file-name order, each in one transaction together with its row in schema_migrations
# (version = file name, checksum = its SHA-256). Safe to run again, and from several places at
# once: every migration's transaction first takes an advisory lock and checks again that its
# version is not applied yet.
#
#   scripts/migrate.sh DSN          e.g. "host=db.internal dbname=sluice user=sluice_owner"
#                                   or postgresql://sluice_owner@db.internal/sluice
#   scripts/migrate.sh --status DSN the migrations of sql/ and whether each is applied
#   scripts/migrate.sh --baseline VERSION DSN
#                                   records the migrations up to VERSION (a file name of sql/,
#                                   e.g. 0010_history_ids_in_byte_order.sql) as applied without
#                                   running them: for a database whose schema was made by
#                                   applying sql/ by hand (or by an old compose.yaml), once,
#                                   while schema_migrations is still empty
#
# Needs the psql client (postgresql-client). The role must be able to create the tables
# (the schema's owner; docs/OPERATIONS.md, "PostgreSQL: roles and retention"). A migration
# already applied whose file changed since is reported and not applied again (exit 0). A
# migration that fails is rolled back with its row; the script stops there and exits 1,
# naming it. scripts/stack.sh, the tests' private databases and bench/recorder.sh apply sql/
# through this script.
#
# Env: SLUICE_SQL_DIR (default <repo>/sql).
set -euo pipefail
export LC_COLLATE=C # the glob below sorts sql/NNNN_*.sql by file name

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SQL_DIR="${SLUICE_SQL_DIR:-$SCRIPT_DIR/../sql}"
LOCK_KEY=7385106 # pg_advisory_xact_lock key of Sluice's migrations

say() { printf '[migrate] %s\n' "$*"; }
die() { printf '[migrate] error: %s\n' "$*" >&2; exit 1; }

status=0 baseline=
if [ "${1:-}" = --status ]; then status=1; shift
elif [ "${1:-}" = --baseline ]; then
  [ $# -ge 2 ] && [ -n "$2" ] || die "--baseline needs a VERSION (a file name of sql/)"
  baseline=$2; shift 2
fi
[ $# -eq 1 ] && [ -n "$1" ] || die "usage: scripts/migrate.sh [--status | --baseline VERSION] DSN (see the header of this script)"
dsn=$1
command -v psql >/dev/null || die "psql not found: install the PostgreSQL client (postgresql-client)"
[ -d "$SQL_DIR" ] || die "no migrations directory $SQL_DIR"
SQL_DIR=$(cd "$SQL_DIR" && pwd)

q() { # psql against the DSN, quiet, stopping at the first error (rest: psql args)
  PGCONNECT_TIMEOUT="${PGCONNECT_TIMEOUT:-10}" PGOPTIONS="-c client_min_messages=warning" \
    psql -X -q -v ON_ERROR_STOP=1 "$dsn" "$@"
}

# The DSN is never printed: it may hold a password.
q -1 -c "select pg_advisory_xact_lock($LOCK_KEY)" -c "create table if not exists schema_migrations (
        version    text primary key,
        checksum   text not null,
        applied_at timestamptz not null default now())" >/dev/null \
  || die "cannot reach the database or create schema_migrations (see psql's message above)"
applied=$(q -At -c "select version || ' ' || checksum from schema_migrations") \
  || die "cannot read schema_migrations"

n=0 total=0
shopt -s nullglob
files=("$SQL_DIR"/[0-9][0-9][0-9][0-9]_*.sql)
[ ${#files[@]} -gt 0 ] || die "no migrations (NNNN_*.sql) in $SQL_DIR"

if [ -n "$baseline" ]; then
  [ -f "$SQL_DIR/$baseline" ] && [[ "$baseline" =~ ^[0-9]{4}_[A-Za-z0-9_.-]+\.sql$ ]] \
    || die "--baseline: no migration $baseline in $SQL_DIR"
  [ -z "$applied" ] || die "--baseline: schema_migrations already has rows; a baseline is only for a database whose migrations were all applied without this script"
  rows= k=0
  for f in "${files[@]}"; do
    v=${f##*/}
    [[ "$v" =~ ^[A-Za-z0-9_.-]+$ ]] || die "migration file name not allowed: $v"
    rows+="${rows:+,}('$v', '$(sha256sum "$f" | cut -d' ' -f1)')"
    k=$((k + 1))
    [ "$v" = "$baseline" ] && break
  done
  out=$(q -v lock="$LOCK_KEY" -f - 2>&1 <<SQL
begin;
select pg_advisory_xact_lock(:lock) is null as unlocked \gset
select count(*) = 0 as empty from schema_migrations \gset
\if :empty
insert into schema_migrations (version, checksum) values $rows;
\echo SLUICE_BASELINE_SET
\endif
commit;
SQL
) || { printf '%s\n' "$out" >&2; die "--baseline failed (rolled back)"; }
  [[ "$out" == *SLUICE_BASELINE_SET* ]] \
    || die "--baseline: another runner wrote schema_migrations meanwhile; nothing recorded"
  say "baseline: $k migrations up to $baseline recorded as applied, none run"
  exit 0
fi

# Tables of sql/ but no schema_migrations rows: applied without this script. Running 0001
# again would fail half-way through; say what to do instead. Both looked at in one query: a
# runner beside this one may have committed 0001 with its row since $applied was read.
if [ "$status" = 0 ] && [ -z "$applied" ] \
  && [ "$(q -At -c "select to_regclass('endpoints') is not null
                    and not exists (select 1 from schema_migrations)")" = t ]; then
  die "the database has Sluice's tables but no schema_migrations rows (sql/ applied by hand or by an old compose.yaml): record what it has with scripts/migrate.sh --baseline VERSION DSN, VERSION the last file of sql/ it had, then run this again"
fi
for f in "${files[@]}"; do
  v=${f##*/}
  total=$((total + 1))
  [[ "$v" =~ ^[A-Za-z0-9_.-]+$ ]] || die "migration file name not allowed: $v"
  sum=$(sha256sum "$f" | cut -d' ' -f1)
  prev=$(printf '%s\n' "$applied" | awk -v v="$v" '$1 == v { print $2 }')
  if [ "$status" = 1 ]; then
    if [ -z "$prev" ]; then say "$v: pending"
    elif [ "$prev" = "$sum" ]; then say "$v: applied"
    else say "$v: applied, file changed since"; fi
    continue
  fi
  if [ -n "$prev" ]; then
    [ "$prev" = "$sum" ] || say "warning: migration $v changed after it was applied (not applied again)"
    continue
  fi
  # One transaction: the lock, the check again (another runner may have applied it since the
  # list above was read), the file and its row.
  out=$(q -v v="$v" -v sum="$sum" -v file="$f" -v lock="$LOCK_KEY" -f - 2>&1 <<'SQL'
begin;
select pg_advisory_xact_lock(:lock) is null as unlocked \gset
select count(*) = 0 as todo from schema_migrations where version = :'v' \gset
\if :todo
\i :file
insert into schema_migrations (version, checksum) values (:'v', :'sum');
\echo SLUICE_MIGRATION_APPLIED
\endif
commit;
SQL
) || { printf '%s\n' "$out" >&2; die "migration $v failed (rolled back)"; }
  if [[ "$out" == *SLUICE_MIGRATION_APPLIED* ]]; then
    say "applied $v"
    n=$((n + 1))
  fi
done
[ "$status" = 1 ] || say "up to date: $total migrations in $SQL_DIR, $n applied now"
