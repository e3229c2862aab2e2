#!/usr/bin/env bash
# The console at scale: a ledger of SETTLED settled operations (default 1,000,000) and WAITING
# operations waiting for a person (default 10,000), written through the ledger's own commands by
# the scale test's seeder (no HTTP call per operation), served by `opledger serve`, and loaded in
# headless Chromium. Prints one line per measurement:
#   bench=console-load page=overview|review-queue ... first_paint_ms dom_interactive_ms
#       data_shown_ms (the page's data on screen) bytes (everything transferred) requests
#   bench=search what=operations-title|operations-owner-page|review-title|review-owner-page
#       p50_ms max_ms (a first page through the API, 20 searches each)
# then the scale test's own lines (paging through the queue, a bulk decision of 500).
# Usage: bench/console_load.sh [settled] [waiting]   (a release build; needs Chromium and npm, as
# the console tests do; ~2 GB of disk per million operations). Numbers from a shared or busy
# machine are noise: measure on a quiet one. Search latency at 10M operations is
# bench/operations_search.sh 10000000 (the read models alone, seeded directly).
set -euo pipefail
settled="${1:-1000000}"
waiting="${2:-10000}"
cd "$(dirname "$0")/.."
OPLEDGER_CONSOLE_OPERATIONS="$settled" OPLEDGER_CONSOLE_WAITING="$waiting" cargo test --release --test serve -- \
  console::an_operator_works_through_an_incident_of_a_thousand_waiting_items_in_a_real_browser \
  --exact --nocapture 2>&1 |
  grep -E '^(seeded|served|ok - |  )|bench=|FAILED|test result'
