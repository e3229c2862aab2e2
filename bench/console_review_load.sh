#!/usr/bin/env bash
# The console's review page in an incident: seeds a ledger with N operations waiting for review
# (default 10,000; written through the ledger's commands), starts `opledger serve` on it, and drives
# headless Chromium through the browser scale test, which prints what an operator waits for:
#   - the review page's first contentful paint and when its page of items is shown,
#   - the JSON bytes of one page of the queue,
#   - the time to page through every item, and to abandon 500 in one bulk decision.
# Usage: bench/console_review_load.sh [waiting]   (a release build; needs Chromium and npm, as the
# console tests do). Numbers from a shared or busy machine are noise: measure on a quiet one.
set -euo pipefail
waiting="${1:-10000}"
cd "$(dirname "$0")/.."
OPLEDGER_CONSOLE_WAITING="$waiting" cargo test --release --test serve -- \
  console::an_operator_works_through_an_incident_of_a_thousand_waiting_items_in_a_real_browser \
  --exact --nocapture 2>&1 |
  grep -E '^(seeded|ok - |  )|FAILED|test result'
