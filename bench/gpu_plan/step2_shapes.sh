#!/usr/bin/env bash
# Device call 2 of 3 (bench/gpu_plan/README.md): carry gpu-kit/call2, right after call 1.
#
# Gathers this call's model pieces; finishes step 1's compile if its budget cut it; then, for
# each random-weight target written here in a real model's shape (~1B, ~4B, ~8B, llama layout,
# Q4_0; a random 2-layer F16 DFlash draft beside it), the benchmark with the oracle at every
# fixed draft length and the cost probe (verify k+1 rows and the draft block, k = 1..15): this
# engine's ceiling at that size on this GPU, and with the cost model the speedup any tau would
# give.  Back in OUT: shapes.json, shapes.md, one bench JSON per shape, plan.log.
#
#   GPU_PLAN_SHAPES         shapes to run (default "1b 4b 8b"; see llama_dflash/bench/shapes.py), or
#                           "skip": only gather this call's pieces and finish the build (a machine
#                           that went cold: README.md)
#   GPU_PLAN_SHAPE_TOKENS   tokens per run (default 128)
#   GPU_PLAN_SHAPE_DRAFTS   draft lengths (default 1,2,4,8)
#   GPU_PLAN_BENCH_ARGS     extra `llama-dflash bench` arguments for every run here and in step 3
STEP=step2
STEP_SECONDS=150
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

gather_pieces
finish_build 60

shapes=${GPU_PLAN_SHAPES:-1b 4b 8b}
if [ "$shapes" = skip ]; then
  log "GPU_PLAN_SHAPES=skip: pieces gathered and the build finished, no shapes measured"
  shapes=""
else
  rm -f "$RESULTS/shapes.json" "$RESULTS/shapes.md"  # what comes back is this call's
fi
tokens=${GPU_PLAN_SHAPE_TOKENS:-128}
drafts=${GPU_PLAN_SHAPE_DRAFTS:-1,2,4,8}
n=$(echo $shapes | wc -w)
status=0
jsons=()
i=0
for shape in $shapes; do
  i=$((i + 1))
  dir=$STATE/shapes/$shape
  rm -rf "$dir" && mkdir -p "$dir"
  log "shape $shape: writing the random target and draft"
  if ! within 20 "$VPY" -m llama_dflash.bench.shapes write "$shape" "$dir" > "$dir/write.log" 2>&1; then
    tail -n 5 "$dir/write.log"; log "shape $shape: writing FAILED"; status=1; continue
  fi
  cp "$dir/shape.json" "$RESULTS/$shape.shape.json"
  # the shapes share what is left of the budget (less a reserve for the summary)
  share=$(( $(left 20) / (n - i + 1) ))
  log "shape $shape: $(du -h "$dir/target.gguf" | cut -f1) target; bench, ${share}s at most"
  # shellcheck disable=SC2086
  if timeout --kill-after=10 "$share" "$VPY" -m llama_dflash.cli bench --model "$dir/target.gguf" \
      --draft-model "$dir/draft.gguf" --raw-prompt --ignore-eos --oracle --sweep-draft-tokens "$drafts" \
      --max-tokens "$tokens" --runs 1 --warmup-tokens 16 --quiet --json "$RESULTS/$shape.json" \
      ${GPU_PLAN_BENCH_ARGS:-} > "$RESULTS/$shape.txt" 2> "$dir/bench.log"; then
    jsons+=("$RESULTS/$shape.json")
    log "shape $shape: $(grep -m1 'oracle ceiling' "$RESULTS/$shape.txt" | sed 's/^ *//' || true)"
  else
    tail -n 5 "$dir/bench.log"; log "shape $shape: bench FAILED or ran out of time"; status=1
  fi
  rm -f "$dir/target.gguf" "$dir/draft.gguf"
done

if [ ${#jsons[@]} -gt 0 ]; then
  "$VPY" -m llama_dflash.bench.shapes summarize "${jsons[@]}" --json "$RESULTS/shapes.json" \
    --md "$RESULTS/shapes.md" > /dev/null || { log "summary FAILED"; status=1; }
fi
# (skip: nothing measured in this call, so nothing of an earlier one is handed back as new)
[ -n "$shapes" ] && give "$RESULTS/shapes.json" "$RESULTS/shapes.md" "${jsons[@]}"
finish
exit $status
