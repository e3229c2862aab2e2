#!/bin/bash
# Trace export's cost measured side by side (docs/src/performance.md, "HTTP, trace export and webhooks"):
#   bench/otel_paired.sh SECONDS BINARY_A MODE_A BINARY_B MODE_B
# Two loops run at the same time for SECONDS, each repeating `bench http --operations 5000
# --concurrency 64`, MODE `off` or `on` (export to bench/otlp_sink.py on port 14318). Both share
# the two cores at every moment, so a change in the machine's speed (which moves one build's
# runs by 20-30 % from minute to minute here) slows both alike, and their ratio is what B costs
# more than A: `A off B on` is export's cost, `A off B off` with one binary the control (it should
# come out even). ENV_A and ENV_B (e.g. `ENV_B=OTEL_TRACES_SAMPLER_ARG=0`) are added to a loop's
# environment. Only runs that started and ended while the other loop was running count. Prints
# each loop's counted runs, their mean ops/s, and the cost, 1 - B/A.
set -eu
seconds=$1; a_binary=$2; a_mode=$3; b_binary=$4; b_mode=$5
operations=5000
sink_port=14318
python3 "$(dirname "$0")/otlp_sink.py" "$sink_port" > /dev/null 2>&1 &
sink=$!
out=$(mktemp -d)
trap 'kill $sink 2> /dev/null; rm -rf "$out"' EXIT
sleep 1
loop() {
  local name=$1 binary=$2 mode=$3 extra=$4 deadline=$5 env_run=()
  [ "$mode" = on ] && env_run+=("OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$sink_port")
  [ -n "$extra" ] && env_run+=("$extra")
  while [ "$(date +%s)" -lt "$deadline" ]; do
    local start end ops
    start=$(date +%s.%N)
    ops=$(env "${env_run[@]}" "$binary" bench http --operations "$operations" \
        --concurrency 64 2>&1 | grep -o 'ops_per_s=[0-9]*' | head -1 | cut -d= -f2)
    end=$(date +%s.%N)
    echo "$start $end $ops" >> "$out/$name"
  done
}
deadline=$(( $(date +%s) + seconds ))
loop a "$a_binary" "$a_mode" "${ENV_A:-}" "$deadline" &
loop b "$b_binary" "$b_mode" "${ENV_B:-}" "$deadline" &
wait %2 %3
# A run counts when it lies wholly inside the window where both loops were running: after the
# later of the two first runs' ends, before the earlier of the two last runs' starts.
python3 - "$out/a" "$out/b" <<'PY'
import sys
runs = [[tuple(map(float, line.split())) for line in open(path)] for path in sys.argv[1:3]]
begin = max(loop[0][1] for loop in runs)
finish = min(loop[-1][0] for loop in runs)
rates = []
for name, loop in zip("AB", runs):
    counted = [ops for start, end, ops in loop if start >= begin and end <= finish]
    print(f"{name}: {len(counted)} runs, ops/s " + " ".join(f"{o:.0f}" for o in counted))
    rates.append(sum(counted) / len(counted) if counted else float("nan"))
print(f"A={rates[0]:.0f} B={rates[1]:.0f} ops/s, B costs {100 * (1 - rates[1] / rates[0]):.1f} % more")
PY
