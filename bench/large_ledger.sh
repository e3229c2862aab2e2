#!/bin/bash
# Replay, read-model rebuild and export of a 1M- and a 10M-event ledger, one after another, each
# line tagged with the load average before it (docs/src/performance.md, "Large ledgers").
# Run it in a directory outside the repository with room for ~20 GB, with the release binary
# copied in as ./opledger (a later build then cannot change it mid-run).
cd "${1:-.}"
B=./opledger
run() { echo "## $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg): $*"; /usr/bin/time -f "wall_s=%e max_rss_kb=%M" "$@" 2>&1 | grep -v "^#"; }
# The 10M-event ledger takes ~9 minutes to write at that load; kept between runs.
[ -e 10m.db ] || run $B bench store --concurrency 64 --operations 3334000 --db 10m.db
rm -f 1m.db*
run $B bench store --concurrency 64 --operations 334000 --db 1m.db
for i in 1 2; do run $B bench replay --db 1m.db; done
for i in 1 2; do run $B bench replay --db 10m.db; done
for i in 1 2 3; do run $B bench projections --db 1m.db; done
echo "## perf"
perf record -e cpu-clock -F 499 -g -o perf-1m.data $B bench projections --db 1m.db 2>&1 | grep bench=
run $B bench projections --db 10m.db
rm -f e10m.ndjson e10m.parquet
run $B export --db 10m.db --out e10m.ndjson
ls -l e10m.ndjson
rm -f e10m.ndjson
run $B export --db 10m.db --format parquet --out e10m.parquet
ls -l e10m.parquet
echo "## end $(date -u +%H:%M:%S)"
