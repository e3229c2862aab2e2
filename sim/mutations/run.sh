#!/usr/bin/env bash
# Applies each mutation patch alone, runs the simulator's seeds against it, reports the first
# failing seed and how many failed, and reverts the patch (also on error or Ctrl-C).
# Usage: sim/mutations/run.sh [seeds]   (default 10000). Run from a clean worktree.
set -euo pipefail
cd "$(dirname "$0")/../.."
seeds="${1:-10000}"
if ! git diff --quiet -- domain; then
  echo "domain/ has uncommitted changes; commit or stash them first" >&2
  exit 2
fi
for patch in sim/mutations/*.patch; do
  git apply "$patch"
  trap 'git apply -R "$patch"' EXIT
  cargo build -q -p opledger-sim --example seeds 2>/dev/null
  out="$(./target/debug/examples/seeds "$seeds" 0)"
  git apply -R "$patch"
  trap - EXIT
  failed="$(sed -n 's/^sim: .* failed=\([0-9]*\) .*/\1/p' <<<"$out")"
  first="$(sed -n 's/^first_failing_seed=//p' <<<"$out")"
  echo "$(basename "$patch" .patch): failed=${failed}/${seeds} first_failing_seed=${first}"
done
