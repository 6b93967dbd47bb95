#!/usr/bin/env bash
# Record what a real NVIDIA driver answers, as a fixture the unit tests replay (issue 18).
#
#   scripts/nvml_record.sh [OUT_DIR]      # on a host with an NVIDIA GPU; ~70 s
#
# Writes OUT_DIR (default tests/fixtures/nvml/<host>-<UTC time>/):
#   nvml_check.txt   scripts/nvml_check.py --wait-ms 2000: every reading, every NotSupported,
#                    two polls (change-only), the XID event wait
#   nvidia-smi.txt   nvidia-smi -q (for the reader; the tests do not use it)
#   calls.jsonl      every NVML call nvml-agent made for ~60 s, its answer or error code and its
#                    duration (recovery_logs.sources.nvml_record; the event-set waits included)
#   agent.jsonl      what `recovery-logs nvml-agent --to stdout` printed meanwhile
# tests/nvml/test_recording.py replays every calls.jsonl under tests/fixtures/nvml/ through the
# agent and asserts it prints agent.jsonl again. Commit the directory; do not edit it.
# Exit 9 when the host has no NVML (no driver, no GPU, bindings missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
HOST=$(uname -n | cut -d. -f1)
OUT=${1:-tests/fixtures/nvml/${HOST}-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
"$PY" -c 'import pynvml' 2>/dev/null || "$PY" -m pip install -q 'nvidia-ml-py>=12'
set +e
"$PY" scripts/nvml_check.py --wait-ms 2000 >"$OUT/nvml_check.txt" 2>&1
rc=$?
set -e
if [ "$rc" = 9 ]; then cat "$OUT/nvml_check.txt" >&2; rm -rf "$OUT"; exit 9; fi
command -v nvidia-smi >/dev/null && nvidia-smi -q >"$OUT/nvidia-smi.txt" 2>&1 || true
timeout 120 "$PY" -m recovery_logs.cli nvml-agent --to stdout --interval 5s --for 60 --host "$HOST" \
  --record "$OUT/calls.jsonl" >"$OUT/agent.jsonl"
printf '{"interval_s": 5, "cycles": 12, "host": "%s", "synthetic": false}\n' "$HOST" >"$OUT/meta.json"
echo "nvml_check rc=$rc; $(wc -l <"$OUT/calls.jsonl") NVML calls, $(wc -l <"$OUT/agent.jsonl") events -> $OUT"
