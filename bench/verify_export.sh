#!/bin/bash
# The offline verifier (clients/verify-export/verify_export.py) on proved exports of an existing
# ledger: a whole-log NDJSON and Parquet export (the root recomputed), a slice (an inclusion
# proof per event) and one tenant's whole history (its tree against the signed tenants' map); prints `bench=verify-export format=… proof=… events=… events_per_s=…
# max_rss_mb=…` per run. Also `opledger bench proofs` on the same file (prove p99, tree rebuild).
#
#   bench/verify_export.sh LEDGER.db [WORKDIR]    (pyarrow must be importable by python3 for
#                                                  the Parquet run; the release binary as ./opledger
#                                                  in WORKDIR, or on PATH)
set -euo pipefail
DB=$(realpath "$1")
VERIFIER=$(realpath "$(dirname "$0")/../clients/verify-export/verify_export.py")
cd "${2:-.}"
B=./opledger; [ -x "$B" ] || B=opledger
rm -f bench.key
KEY=$($B keys generate --name bench.example/log --out bench.key 2>/dev/null)
$B bench proofs --db "$DB"
run() {
  local format=$1 proof=$2 file=$3
  local out events
  out=$( { /usr/bin/time -f "wall_s=%e max_rss_kb=%M" python3 "$VERIFIER" "$file" --verifier-key "$KEY"; } 2>&1 )
  events=$(echo "$out" | grep -o "^OK: [0-9]*" | grep -o "[0-9]*")
  local wall rss
  wall=$(echo "$out" | grep -o "wall_s=[0-9.]*" | cut -d= -f2)
  rss=$(echo "$out" | grep -o "max_rss_kb=[0-9]*" | cut -d= -f2)
  echo "bench=verify-export format=$format proof=$proof events=$events events_per_s=$(python3 -c "print(round($events / max($wall, 0.01)))") max_rss_mb=$((rss / 1024))"
}
$B export --db "$DB" --key-file bench.key --out bench-whole.ndjson > /dev/null
run ndjson root bench-whole.ndjson
$B export --db "$DB" --key-file bench.key --format parquet --out bench-whole.parquet > /dev/null
run parquet root bench-whole.parquet
$B export --db "$DB" --key-file bench.key --from 1 --to 100000 --out bench-slice.ndjson > /dev/null
run ndjson inclusion bench-slice.ndjson
# One tenant's whole history (`bench store` writes every operation as tenant `bench`): an
# inclusion proof per event and the tenant's tree recomputed against the signed tenants' map.
$B export --db "$DB" --key-file bench.key --tenant bench --format parquet --out bench-tenant.parquet > /dev/null
run parquet tenant bench-tenant.parquet
rm -f bench-whole.ndjson bench-whole.parquet bench-slice.ndjson bench-tenant.parquet bench.key
