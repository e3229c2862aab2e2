#!/usr/bin/env bash
# opledger peer on PostgreSQL: `opledger serve` with its ledger in a database of the Debian
# PostgreSQL cluster that run-dbos.sh uses (`pg_lsclusters`; default settings: fsync=on,
# synchronous_commit=on), over TCP 127.0.0.1, so opledger and DBOS are compared on the same server
# with the same durability. Everything else is run-opledger.sh's: one `keyed` provider whose
# base_url is the stub CRM, the driver (common/loadgen.mjs) calling
# POST /v1/operations?execute=true&wait_ms=10000, an op counting only when the answer says
# "state":"succeeded", a unique source_id per op, the exactly-once checks (`#` lines).
# The database `opledger_bench` (role of the same name, a throwaway password) is created fresh and
# dropped at the end; a cluster this script started is stopped again.
#
# Copy it into the peers' harness (it sources common/lib.sh there) and run it from there, alone
# or as a peer of run-all.sh (PEERS="dbos opledger-postgres").
#
# Env knobs: CONCS="1 32 64"  N1=2000 (n at conc 1)  NC=5000 (n at conc > 1)  WARMUP=200  KEEP_DATA=0
#            SSLMODE=disable (opledger's sslmode; prefer = libpq's default, what DBOS uses)
#            PG_STATEMENTS=1: print each level's statements from pg_stat_statements (calls, total
#            and mean ms, rows), which needs shared_preload_libraries = 'pg_stat_statements' on
#            the cluster (set it in conf.d and restart; remove it again afterwards)
#            OPLEDGER=path/to/target/release/opledger (required: a built binary; this script never builds)
# Prints: peer=opledger-postgres conc=C n=N ops_per_s=... p50_ms=... p99_ms=... errors=E wall_s=...
set -euo pipefail
source "$(dirname "$0")/common/lib.sh"
trap 'cleanup; drop_db; stop_pg' EXIT

CONCS="${CONCS:-1 32 64}"
N1="${N1:-2000}"
NC="${NC:-5000}"
WARMUP="${WARMUP:-200}"
OPLEDGER="$(readlink -f "${OPLEDGER:-target/release/opledger}")"
[ -x "$OPLEDGER" ] || { echo "opledger binary not found at $OPLEDGER (set OPLEDGER=...)" >&2; exit 1; }
command -v pg_lsclusters >/dev/null || { echo "no Debian PostgreSQL: run ./install-dbos.sh (it installs it)" >&2; exit 1; }
echo "# opledger: $("$OPLEDGER" --version) (binary sha256 $(sha256sum "$OPLEDGER" | cut -c1-16))"

# The same cluster as run-dbos.sh: the first one listed, started if it is down.
read -r PGVER PGCLUSTER PGPORT PGSTATUS _ < <(pg_lsclusters -h | head -1)
STARTED_PG=0
DB_CREATED=0
stop_pg() { if [ "$STARTED_PG" = 1 ]; then pg_ctlcluster "$PGVER" "$PGCLUSTER" stop || true; fi; }
psql_admin() { runuser -u postgres -- psql -p "$PGPORT" -v ON_ERROR_STOP=1 -qAt "$@"; }
drop_db() {
  if [ "$DB_CREATED" = 1 ] && [ "${KEEP_DATA:-0}" != 1 ]; then
    psql_admin -c "SET client_min_messages=warning" -c "DROP DATABASE IF EXISTS opledger_bench WITH (FORCE)" || true
  fi
}
if [ "$PGSTATUS" != online ]; then
  pg_ctlcluster "$PGVER" "$PGCLUSTER" start
  STARTED_PG=1
fi
psql_admin -c "SELECT 'fsync='||current_setting('fsync')||' synchronous_commit='||current_setting('synchronous_commit')||' wal_sync_method='||current_setting('wal_sync_method')||' server_version='||current_setting('server_version')" | sed 's/^/# postgres: /'
# Throwaway credentials for this run only; opledger reads the password from PGPASSWORD, as libpq does.
export PGPASSWORD="bench-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
psql_admin -c "DO \$\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='opledger_bench') THEN CREATE ROLE opledger_bench LOGIN; END IF; END\$\$;"
psql_admin -c "ALTER ROLE opledger_bench PASSWORD '$PGPASSWORD'"
psql_admin -c "SET client_min_messages=warning" -c "DROP DATABASE IF EXISTS opledger_bench WITH (FORCE)"
psql_admin -c "CREATE DATABASE opledger_bench OWNER opledger_bench;"
DB_CREATED=1
psql_admin -c "SELECT pg_stat_reset_shared('wal')" >/dev/null

# CPU (user+system, clock ticks) of the cluster's processes: the postmaster and its children
# (backends, WAL writer, checkpointer), not other clusters on the machine.
pg_cpu() {
  python3 - "$(head -1 "$(psql_admin -c 'SHOW data_directory')/postmaster.pid")" <<'PY'
import os, sys
postmaster, total = sys.argv[1], 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    if pid == postmaster or fields[1] == postmaster:
        total += int(fields[11]) + int(fields[12])
print(total)
PY
}
if [ "${PG_STATEMENTS:-0}" = 1 ]; then psql_admin -d postgres -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"; fi
WD="$(mktemp -d /var/tmp/opledger-pg-bench.XXXXXX)"
track_dir "$WD"
start_stub "$WD"

export OPL_BENCH_TENANT_TOKEN="bench-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
export OPL_BENCH_CRM_TOKEN="stub-crm-token"
# SSLMODE (default disable, as in the published runs, so the numbers compare): the
# connection is loopback TCP. DBOS's libpq negotiates TLS on it (its default `prefer`), which
# costs DBOS a little CPU; SSLMODE=prefer makes opledger do the same (it accepts the Debian
# cluster's self-signed "snakeoil" certificate under prefer/require, as libpq does).
cat >"$WD/opledger.toml" <<TOML
listen = "127.0.0.1:0"
store = "postgres://opledger_bench@127.0.0.1:$PGPORT/opledger_bench?sslmode=${SSLMODE:-disable}"

[[tenants]]
id = "bench"
token_env = "OPL_BENCH_TENANT_TOKEN"

[[connectors]]
id = "crm"
preset = "crm-stand-keyed"
base_url = "$STUB_URL"

[[connectors.accounts]]
id = "bench"
tenants = ["bench"]
token_env = "OPL_BENCH_CRM_TOKEN"
TOML
# Created here: the background shell below opens it only once it runs, after the loop may look.
: >"$WD/serve.log"
( cd "$WD" && exec "$OPLEDGER" serve --config "$WD/opledger.toml" ) >"$WD/serve.log" 2>&1 &
SERVE_PID=$!
track_pid "$SERVE_PID"
API=""
for _ in $(seq 1 300); do
  API="$(sed -n 's|^opledger serve: listening on \(http://[0-9.]*:[0-9]*\).*|\1|p' "$WD/serve.log" | head -1)"
  [ -n "$API" ] && break
  kill -0 "$SERVE_PID" 2>/dev/null || break
  sleep 0.1
done
[ -n "$API" ] || { echo "opledger serve did not start; its log:" >&2; cat "$WD/serve.log" >&2; exit 1; }
wait_http "$API/healthz" 30

URL="$API/v1/operations?execute=true&wait_ms=10000"
AUTH="authorization: Bearer $OPL_BENCH_TENANT_TOKEN"
BODY='{"provider":"crm","account":"bench","action":"create_task","args":{"title":"task {key}"},"source_id":"{key}"}'
EXPECT='"state":"succeeded"'
RUN="r$(date +%s)"

probe="$(curl -sS -m 15 -X POST "$URL" -H "$AUTH" -H 'content-type: application/json' \
  -d "${BODY//\{key\}/$RUN-probe}" 2>&1)" || true
case "$probe" in
  *"$EXPECT"*) ;;
  *) echo "opledger probe operation failed: $probe" >&2; tail -20 "$WD/serve.log" >&2; exit 1 ;;
esac

total=1
for C in $CONCS; do
  if [ "$C" = 1 ]; then N="$N1"; else N="$NC"; fi
  cpu0="$(awk '{print $14+$15}' /proc/$SERVE_PID/stat)"
  pgcpu0="$(pg_cpu)"
  if [ "${PG_STATEMENTS:-0}" = 1 ]; then psql_admin -d postgres -c "SELECT pg_stat_statements_reset()" >/dev/null; fi
  node "$PEERS_DIR/common/loadgen.mjs" --url "$URL" --header "$AUTH" --body-template "$BODY" --expect "$EXPECT" \
    --n "$N" --conc "$C" --warmup "$WARMUP" --key-prefix "$RUN-c$C" --label "peer=opledger-postgres"
  cpu1="$(awk '{print $14+$15}' /proc/$SERVE_PID/stat)"
  # opledger's own CPU and the cluster's (user+system, clock ticks of 10 ms) per operation,
  # warm-up included.
  pgcpu1="$(pg_cpu)"
  echo "# opledger-postgres cpu: conc=$C cpu_ms_per_op=$(python3 -c "print(round(($cpu1-$cpu0)*10/($N+$WARMUP),3))") postgres_cpu_ms_per_op=$(python3 -c "print(round(($pgcpu1-$pgcpu0)*10/($N+$WARMUP),3))")"
  if [ "${PG_STATEMENTS:-0}" = 1 ]; then
    psql_admin -d postgres -F '|' -c "SELECT calls, round(total_exec_time::numeric,1), round(mean_exec_time::numeric,3), rows, left(regexp_replace(query,'\s+',' ','g'),110) FROM pg_stat_statements WHERE dbid=(SELECT oid FROM pg_database WHERE datname='opledger_bench') ORDER BY calls DESC LIMIT 25" \
      | sed "s/^/# opledger-postgres statements: conc=$C calls|total_ms|mean_ms|rows|query: /"
  fi
  total=$((total + N + WARMUP))
done

# Exactly-once check: every distinct operation reached the CRM once, and re-sending a sample of
# finished operations (same source_id, same arguments) must answer succeeded without a CRM call.
before="$(stub_stats)"
first_c="${CONCS%% *}"
resend="$(node "$PEERS_DIR/common/loadgen.mjs" --url "$URL" --header "$AUTH" --body-template "$BODY" --expect "$EXPECT" \
  --n 100 --conc 8 --key-prefix "$RUN-c$first_c" --label "peer=opledger-postgres check=resend-100-done-ops")"
after="$(stub_stats)"
resend_errors="$(sed -n 's/.* errors=\([0-9]*\).*/\1/p' <<<"$resend")"
echo "# opledger-postgres check: expected_crm_calls=$total stub_before_resend=$before stub_after_resend=$after resend_not_succeeded=$resend_errors"

for _ in $(seq 1 50); do
  metrics="$(curl -fsS -m 10 "$API/metrics")" || metrics=""
  grep -qx 'opledger_read_model_lag_positions 0' <<<"$metrics" && break
  sleep 0.1
done
echo "# opledger-postgres ledger: $(grep -E '^opledger_(operations\{|intents_recorded_total |attempts_started_total |unknown_outcomes_total |duplicates_detected_total |shared_external_ids )' <<<"$metrics" \
  | sed -E 's/^opledger_//; s/\{state="([a-z_]+)"\}/_\1/; s/ /=/' | tr '\n' ' ')"
# Durability evidence, as run-dbos.sh prints it: WAL flushes and commits during the run.
echo "# postgres during run: $(psql_admin -c "SELECT 'wal_sync='||wal_sync||' wal_records='||wal_records||' db_commits='||(SELECT xact_commit FROM pg_stat_database WHERE datname='opledger_bench') FROM pg_stat_wal")"
