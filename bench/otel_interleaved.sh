#!/bin/bash
# Trace export's cost, two builds run by run (docs/src/performance.md, "HTTP, trace export and webhooks"):
#   bench/otel_interleaved.sh ROUNDS BINARY_A BINARY_B
# Each round runs `bench http --operations 20000 --concurrency 64` with export off and on for both
# builds, interleaved, the order reversed every other round, against bench/otlp_sink.py on port
# 14318. Prints one line a run: binary, off|on, ops/s, CPU µs per operation (user + system), load.
set -eu
rounds=$1; a=$2; b=$3
sink_port=14318
python3 "$(dirname "$0")/otlp_sink.py" "$sink_port" > /dev/null 2>&1 &
sink=$!
trap 'kill $sink' EXIT
sleep 1
run() {
  local binary=$1 export=$2 env_export=()
  [ "$export" = on ] && env_export=("OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$sink_port")
  local out
  out=$( { env "${env_export[@]}" /usr/bin/time -f "TIME %U %S" "$binary" bench http \
      --operations 20000 --concurrency 64; } 2>&1 )
  local ops cpu
  ops=$(echo "$out" | grep -o 'ops_per_s=[0-9]*' | head -1 | cut -d= -f2)
  cpu=$(echo "$out" | awk '/^TIME/ {printf "%.1f", ($2 + $3) * 1e6 / 20000}')
  echo "$(basename "$binary") $export $ops $cpu $(cut -d' ' -f1 /proc/loadavg)"
}
for round in $(seq "$rounds"); do
  if [ $((round % 2)) = 1 ]; then
    run "$a" off; run "$b" off; run "$a" on; run "$b" on
  else
    run "$b" on; run "$a" on; run "$b" off; run "$a" off
  fi
done
