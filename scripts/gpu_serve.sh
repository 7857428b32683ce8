#!/usr/bin/env bash
# gpu_check.sh's serving sections: a random Llama-shaped model with Llama-3's vocabulary
# (scripts/random_model.py; SmolLM2's tokenizer widened to 128,256 ids), `nitsum serve
# --workers 1 --no-control` on it, and one load, capped so the section ends within its budget
# (the bench's deadline is what is left of DEADLINE_S after the model and the server start;
# what did not finish by then counts as errors):
#   closed  (the serve section) `nitsum bench --trace random`: vLLM's `bench serve` shape,
#           1,024 random prompt ids, 128 output tokens, EOS ignored, at concurrency 1, 16 and
#           64 (8, 64 and 256 requests), prompts from the whole vocabulary;
#   bursty  (the bursty section) the bursty load of the 2026-11-26/27 H200 runs, 4 <-> 24
#           req/s over 40 s, inputs 128:2000, outputs 64:256, rate scale 1.
# usage (from the project root, nitsum on PYTHONPATH):
#   gpu_serve.sh DEVICE DEADLINE_S WORKDIR OUTJSON [closed|bursty]
# writes the bench's results to OUTJSON (X.json), the worker's step log to X-steps.jsonl and
# the server's log to X-server.log.
# DEVICE cuda: 32 layers, hidden 4096 (8.0 B params, bf16); DEVICE cpu: the dry run's
# 2-layer hidden-256 model and a light load.
set -u
DEV=$1 DEADLINE=$2 W=$3 OUTJSON=$4 LOAD=${5:-closed}
STEPS=${OUTJSON%.json}-steps.jsonl SLOG=${OUTJSON%.json}-server.log
PY=${PYTHON:-python3}
START=$(date +%s)
CLI=(-c 'import sys; from nitsum.cli import main; sys.exit(main(sys.argv[1:]))')
nitsum() { "$PY" "${CLI[@]}" "$@"; }
# NOTE: run in the background, `exec` makes $! the server itself: killing a subshell that
# runs it would leave the server (and its port, and its GPU memory) to the next section.
nitsum_exec() { exec "$PY" "${CLI[@]}" "$@"; }
elapsed() { echo $(( $(date +%s) - START )); }

M=$W/rand-model
if [ "$DEV" = cuda ]; then
  SHAPE=(--layers 32 --hidden 4096 --heads 32 --kv-heads 8 --device cuda)
  KV= LO=4 HI=24 DUR=40 IN=128:2000 OUTL=64:256
  CLOSED=(--random-input-len 1024 --random-output-len 128 --max-concurrency 1 16 64
          --num-prompts 8 64 256)
else
  SHAPE=(--layers 2 --hidden 256 --heads 4 --kv-heads 2 --device cpu)
  KV=256 LO=0.5 HI=1 DUR=10 IN=32:256 OUTL=8:32
  CLOSED=(--random-input-len 64 --random-output-len 16 --max-concurrency 1 2 4
          --num-prompts 2 4 8)
fi
case $LOAD in
  closed|bursty) ;;
  *) echo "[serve] unknown load $LOAD (closed or bursty)"; exit 2 ;;
esac
# The KV pool: `nitsum serve`'s default (on CUDA 0.9 of the device's memory, as vLLM's), or
# GPU_SERVE_KV_MB MiB (the 2026-11-26 and 11-27 runs: 30000).
KV=${GPU_SERVE_KV_MB:-$KV}
KV_FLAGS=()
[ -n "$KV" ] && KV_FLAGS=(--kv-cache-mb "$KV")
# GPU_SERVE_FLAGS: more `nitsum serve` flags, for experiments (e.g. "--token-budget 2048").
read -r -a EXTRA_FLAGS <<< "${GPU_SERVE_FLAGS:-}"
# The tokenizer: carried (gpu_check.sh --prepare); else, on a machine that has it, the
# prepared embedded model's (a CPU dry run without --prepare).
TOK=.gpu_carry/tokenizer
if [ ! -f "$TOK/tokenizer.json" ]; then
  TOK=$("$PY" -c 'from nitsum.engine.load import resolve_model_dir; print(resolve_model_dir(None))') \
    || { echo "[serve] no tokenizer: run scripts/gpu_check.sh --prepare first"; exit 1; }
fi
if [ ! -f "$M/config.json" ]; then
  "$PY" scripts/random_model.py "$M" "${SHAPE[@]}" --tokenizer-dir "$TOK" || exit 1
fi
echo "[serve] model ready at $(elapsed) s"

PORT=${GPU_CHECK_PORT:-8123}
# NOTE: the workers' socket next to the HTTP port, not the default 5557 (a server left
# running on this machine must not fail the section).
# NOTE: every step of the worker's engine goes to a step log (engine/step_log.py), summarized
# after the load (scripts/step_log_summary.py): where the served time went.
rm -f "$STEPS"
NITSUM_STEP_LOG=$STEPS nitsum_exec serve --model "$M" --device "$DEV" --workers 1 \
  --dtype bfloat16 ${KV_FLAGS[@]+"${KV_FLAGS[@]}"} ${EXTRA_FLAGS[@]+"${EXTRA_FLAGS[@]}"} --port "$PORT" \
  --worker-addr "tcp://127.0.0.1:$((PORT + 1))" --no-control > "$SLOG" 2>&1 &
SP=$!
stop() { kill "$SP" 2>/dev/null; wait "$SP" 2>/dev/null; }
trap stop EXIT
health() {
  "$PY" -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/health', timeout=2).status_code != 200)" \
    2>/dev/null
}
until health; do
  sleep 1
  if ! kill -0 "$SP" 2>/dev/null; then echo "[serve] server died"; tail -30 "$SLOG"; exit 1; fi
  if [ "$(elapsed)" -gt $(( DEADLINE * 6 / 10 )) ]; then
    echo "[serve] not ready after $(elapsed) s"; tail -30 "$SLOG"; exit 1
  fi
done
echo "[serve] server ready at $(elapsed) s"

# The bench's global deadline: what is left, less 10 s to stop and report.
CAP=$(( DEADLINE - $(elapsed) - 10 ))
[ "$CAP" -lt 20 ] && CAP=20
echo "[serve] bench capped at $CAP s (unfinished requests count as errors)"
if [ "$LOAD" = closed ]; then
  # NOTE: prompt ids from Llama-3's ordinary tokens (its 256 special ones start at 128000).
  nitsum bench --url "http://127.0.0.1:$PORT" --trace random "${CLOSED[@]}" \
    --token-ids 0:128000 --timeout "$CAP" --no-progress --out "$OUTJSON" 2>&1 | tail -40
else
  nitsum bench --url "http://127.0.0.1:$PORT" --trace bursty --bursty-low-rate $LO \
    --bursty-high-rate $HI --bursty-period 20 --bursty-duration $DUR --bursty-input $IN \
    --bursty-output $OUTL --tier-mix strict=0.3,relaxed=0.5,background=0.2 --rate-scale 1 \
    --timeout "$CAP" --no-progress --out "$OUTJSON" 2>&1 | tail -20
fi
RC=${PIPESTATUS[0]}
echo "[serve] bench done at $(elapsed) s (rc $RC)"
grep -iE "error|traceback|KV per device|preempt" "$SLOG" | head -10
stop
[ -f "$STEPS" ] && "$PY" scripts/step_log_summary.py "$STEPS"
exit "$RC"
