#!/usr/bin/env bash
# The host's work per graphed decode step (bench/profile_host.py, SmolLM2-135M, asynchronous)
# under each way of waiting for a step's tokens (profile_host.py --wait) and a pinned thread,
# in separate processes, the variants interleaved over ROUNDS rounds (this VM's speed drifts
# between processes). Usage: OUT=dir ROUNDS=3 [CPU=3] [VARIANTS="sync yield sync:pin"] bash bench/profile_wait.sh
set -u
OUT=${OUT:-.}; ROUNDS=${ROUNDS:-3}; CPU=${CPU:-3}
mkdir -p "$OUT"
{ lscpu; echo; grep -i -E "nvidia|CPU" /proc/interrupts | head -5; echo; cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list | sort -u | tr '\n' ' '; echo; } > "$OUT/machine.txt" 2>&1
for r in $(seq 1 "$ROUNDS"); do
  for v in ${VARIANTS:-sync poll event-block yield block sync:pin poll:pin}; do
    mode=${v%%:pin}; pin=(); label="$mode-r$r"
    if [[ $v == *:pin ]]; then pin=(--cpu-affinity "$CPU"); label="$mode-pin$CPU-r$r"; fi
    python3 bench/profile_host.py --out "$OUT" --models SmolLM2-135M --repeats 3 --steps 300 --async-only --wait "$mode" "${pin[@]}" --label "$label" 2>&1 | grep -E "host work|migrations|Error|error" | sed "s/^/[$label] /"
  done
done
