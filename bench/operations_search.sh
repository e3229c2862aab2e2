#!/usr/bin/env bash
# Search latency of the operations listing at scale: writes N operations (default 1,000,000) into
# a read-model file, then times 200 searches by an argument's value (a title) and 200 first pages
# of one owner's operations (newest first), printing p50 and p99 in microseconds and the query
# plans (which must read through the terms' index, never scan the operations).
# Usage: bench/operations_search.sh [operations]   (a release build). Numbers from a shared or busy
# machine are noise: measure on a quiet one.
set -euo pipefail
operations="${1:-1000000}"
cd "$(dirname "$0")/.."
OPLEDGER_SEARCH_OPERATIONS="$operations" cargo test --release -p opledger-readmodel --test readmodel -- \
  search_latency_at_scale --exact --ignored --nocapture 2>&1 |
  grep -E '^(seeded|bench=)|FAILED|panicked|test result'
