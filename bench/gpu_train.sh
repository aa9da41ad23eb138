#!/usr/bin/env bash
# Train DSpark (or EAGLE-3) drafts for a target on one GPU within a time budget:
#   1. the mixed data set, answered by a PyTorch copy of the target (--data-backend torch), capped
#      in time (it resumes, so a capped run keeps what it made);
#   2. several draft shapes trained side by side on that one data set, each for the time left;
#   3. every draft exported as q4_0 into OUT_DIR, the logs and training reports in OUT_DIR/logs.tar.gz.
#
#   bench/gpu_train.sh OUT_DIR [BUDGET_SECONDS]      (default budget 540)
#
# Environment:
#   GPU_TRAIN_PYTHON     interpreter with llama-dflash importable (default: .venv/bin/python, else python3)
#   GPU_TRAIN_MODEL      target GGUF (default: the embedded SmolLM2-135M-Instruct)
#   GPU_TRAIN_WORK       work directory (default OUT_DIR/work; features take ~8 GB per million tokens)
#   GPU_TRAIN_TOKENS     training answer tokens to generate (default 3000000)
#   GPU_TRAIN_DATA_SECONDS  cap on data generation (default 200)
#   GPU_TRAIN_VARIANTS   draft shapes as LAYERS:HEAD_TOKENS, space-separated (default "1:4096 1:8192 2:4096")
#   GPU_TRAIN_DEVICE     PyTorch device (default cuda)
#   GPU_TRAIN_NSEQ       sequences per data batch (default 512)
#   GPU_TRAIN_INIT       a draft GGUF every variant starts from (--init-from-draft; variants of its shape),
#                        e.g. the shipped default, to continue it on new data instead of starting afresh
#   GPU_TRAIN_DISTILL    --distill weight (the target's distribution in the loss; default 0.5, 0: labels only)
#   GPU_TRAIN_ARGS       extra `llama-dflash train` arguments for every variant
#   GPU_TRAIN_ALGORITHM  dspark (default) or eagle3 (one decoder layer: variants "1:HEAD"; the same data set
#                        serves both, e.g. GPU_TRAIN_ALGORITHM=eagle3 GPU_TRAIN_VARIANTS="1:4096 1:8192")
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
out=${1:?usage: bench/gpu_train.sh OUT_DIR [BUDGET_SECONDS]}
budget=${2:-540}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
py=${GPU_TRAIN_PYTHON:-}
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
work=${GPU_TRAIN_WORK:-$out/work}
tokens=${GPU_TRAIN_TOKENS:-3000000}
data_s=${GPU_TRAIN_DATA_SECONDS:-200}
variants=${GPU_TRAIN_VARIANTS:-"1:4096 1:8192 2:4096"}
device=${GPU_TRAIN_DEVICE:-cuda}
nseq=${GPU_TRAIN_NSEQ:-512}
distill=${GPU_TRAIN_DISTILL:-0.5}
algo=${GPU_TRAIN_ALGORITHM:-dspark}
case "$algo" in dspark|eagle3) ;; *) echo "GPU_TRAIN_ALGORITHM must be dspark or eagle3, not $algo" >&2; exit 2;; esac
init_args=()
[ -n "${GPU_TRAIN_INIT:-}" ] && init_args=(--init-from-draft "$GPU_TRAIN_INIT")
model_args=()
[ -n "${GPU_TRAIN_MODEL:-}" ] && model_args=(--model "$GPU_TRAIN_MODEL")
nv=$(echo $variants | wc -w)
threads=$(( $(nproc) / nv )); [ "$threads" -ge 1 ] || threads=1
t0=$(date +%s)
step() { echo "[gpu-train +$(( $(date +%s) - t0 ))s] $*"; }

# shared by the data run and every variant: the same data set (same mix settings) in every workdir
common=(-m llama_dflash.cli train "${model_args[@]}" --data mix --data-backend torch --device "$device"
        --n-seq "$nseq" --sampled-every 1 --seed-samples 2 --eval-seqs 48 --algorithm "$algo" --block-size 5
        --seed 0 --no-progress)

logs="$work/logs"
mkdir -p "$work/data" "$logs"
step "data: up to $tokens training tokens, at most ${data_s}s"
timeout "$data_s" "$py" "${common[@]}" --output "$work/data/unused.gguf" --workdir "$work/data" \
  --data-tokens "$tokens" --data-only --threads "$(nproc)" >"$logs/data.log" 2>&1
rc=$?
[ $rc -eq 0 ] || [ $rc -eq 124 ] || { step "data generation failed (rc $rc)"; tail -n 30 "$logs/data.log"; exit 1; }
step "data done (rc $rc): $(grep -c . "$work/data/mix/seqs.jsonl") sequences"
if [ "$distill" != "0" ]; then  # once for every variant (they share the data directory)
  "$py" "${common[@]}" --output "$work/data/unused.gguf" --workdir "$work/data" --reuse-data --data-only \
    --distill "$distill" --threads "$(nproc)" >"$logs/soft.log" 2>&1 || { step "soft labels failed"; tail -n 30 "$logs/soft.log"; exit 1; }
  step "soft labels done"
fi

reserve=75  # parity, a one-prompt engine check and the exports after training
left=$(( budget - ($(date +%s) - t0) - reserve ))
[ "$left" -ge 30 ] || { step "no time left to train ($left s)"; exit 1; }
minutes=$("$py" -c "print(round($left / 60, 2))")
step "training $nv variants side by side for $minutes min each"
pids=()
for v in $variants; do
  layers=${v%%:*}; head=${v##*:}
  d="$work/L${layers}-V${head}"
  mkdir -p "$d"
  ln -sfn "$work/data/mix" "$d/mix"
  "$py" "${common[@]}" --output "$d/draft-f32.gguf" --workdir "$d" --reuse-data \
    --draft-layers "$layers" --train-vocab "$head" --steps 100000 --train-minutes "$minutes" \
    --lr 2e-3 --batch-size 32 --anchors-per-seq 48 --eval-every 1000 --eval-prompts 1 --max-new-tokens 64 --distill "$distill" \
    --eval-draft-tokens 4 --threads "$threads" "${init_args[@]}" ${GPU_TRAIN_ARGS:-} >"$logs/L${layers}-V${head}.log" 2>&1 &
  pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
step "training done (failures: $fail)"
for v in $variants; do
  layers=${v%%:*}; head=${v##*:}
  name="L${layers}-V${head}"
  d="$work/$name"
  [ -f "$d/draft-f32.gguf" ] || { step "$name: no draft"; tail -n 20 "$logs/$name.log"; continue; }
  cp "$d/report.json" "$logs/$name.report.json" 2>/dev/null
  "$py" -m llama_dflash.cli export "${model_args[@]}" --quantize q4_0 "$d/draft-f32.gguf" "$out/$name.q4_0.gguf" >/dev/null
  step "$name: $(grep -o '"best_mean_accepted": [0-9.]*' "$d/report.json") $(grep -o '"agreement": [0-9.]*' "$d/report.json")"
done
tar -czf "$out/logs.tar.gz" -C "$work" logs
step "done"
