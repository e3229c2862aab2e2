#!/usr/bin/env bash
# floor "peer": `opledger bench floor`, the least a record-and-execute call costs here. It serves
# POST /v1/operations doing only the two durable appends of opledger's SQLite store (intent with
# the claim of its attempt, then the outcome; WAL, synchronous=FULL, group commit) around one
# POST <stub>/keyed/bench/tasks with an Idempotency-Key, with opledger's own HTTP stacks (axum in,
# reqwest out) and none of the rest: no read models, engine, hash chain, contract checks or
# workers. It is a bound, not a ledger: it answers each source_id once (a re-send is refused), so
# the exactly-once re-send check of run-opledger.sh is not run; the stub's call count is printed.
#
# Lives in opledger's repository (bench/peers/); copy it beside the harness's run-*.sh to use it.
# Env knobs: CONCS="1 32 64"  N1=2000  NC=5000  WARMUP=200
#            OPLEDGER=path/to/target/release/opledger (required: a built binary; never builds)
# Prints: peer=floor conc=C n=N ops_per_s=... p50_ms=... p99_ms=... errors=E wall_s=...
set -euo pipefail
source "$(dirname "$0")/common/lib.sh"
trap cleanup EXIT

CONCS="${CONCS:-1 32 64}"
N1="${N1:-2000}"
NC="${NC:-5000}"
WARMUP="${WARMUP:-200}"
OPLEDGER="$(readlink -f "${OPLEDGER:-target/release/opledger}")"
[ -x "$OPLEDGER" ] || { echo "opledger binary not found at $OPLEDGER (set OPLEDGER=...)" >&2; exit 1; }
echo "# floor: $("$OPLEDGER" --version) (binary sha256 $(sha256sum "$OPLEDGER" | cut -c1-16))"

WD="$(mktemp -d /var/tmp/floor-bench.XXXXXX)"
track_dir "$WD"
start_stub "$WD"
"$OPLEDGER" bench floor --provider-url "$STUB_URL/keyed/bench/tasks" --db "$WD/ledger.db" \
  >"$WD/floor.log" 2>&1 &
FLOOR_PID=$!
track_pid "$FLOOR_PID"
API=""
for _ in $(seq 1 300); do
  API="$(sed -n 's|^opledger bench floor: listening on \(http://[0-9.]*:[0-9]*\).*|\1|p' "$WD/floor.log" | head -1)"
  [ -n "$API" ] && break
  kill -0 "$FLOOR_PID" 2>/dev/null || break
  sleep 0.1
done
[ -n "$API" ] || { echo "opledger bench floor did not start; its log:" >&2; cat "$WD/floor.log" >&2; exit 1; }

URL="$API/v1/operations?execute=true&wait_ms=10000"
BODY='{"provider":"crm","account":"bench","action":"create_task","args":{"title":"task {key}"},"source_id":"{key}"}'
EXPECT='"state":"succeeded"'
RUN="r$(date +%s)"

total=0
for C in $CONCS; do
  if [ "$C" = 1 ]; then N="$N1"; else N="$NC"; fi
  cpu0="$(awk '{print $14+$15}' /proc/$FLOOR_PID/stat)"
  node "$PEERS_DIR/common/loadgen.mjs" --url "$URL" --body-template "$BODY" --expect "$EXPECT" \
    --n "$N" --conc "$C" --warmup "$WARMUP" --key-prefix "$RUN-c$C" --label "peer=floor"
  cpu1="$(awk '{print $14+$15}' /proc/$FLOOR_PID/stat)"
  echo "# floor cpu: conc=$C cpu_ms_per_op=$(python3 -c "print(round(($cpu1-$cpu0)*10/($N+$WARMUP),3))")"
  total=$((total + N + WARMUP))
done
echo "# floor stub: operations_submitted=$total stub=$(stub_stats)"
