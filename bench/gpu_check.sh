#!/usr/bin/env bash
# One-shot GPU check (also: make gpu-check).
#
#   bench/gpu_check.sh [OUT_DIR]            the check; results in OUT_DIR (default gpu-check-<UTC time>)
#   bench/gpu_check.sh cmake-args BACKEND   print llama-cpp-python's CMAKE_ARGS for cuda|metal|vulkan|rocm,
#                                           or say which toolkit is missing and exit 2 (used by make setup GPU=...)
#
# On a machine with an NVIDIA GPU: builds llama-cpp-python 0.3.36 with CUDA for the local GPU
# architecture only (skipped when the installed build already runs on CUDA), runs the test suite
# with every layer offloaded (the library's default, n_gpu_layers -1), then the ordinary vs
# speculative benchmark on the default pair at 512, 1024 and 2048 tokens with draft lengths 1-8
# and auto, plus the oracle ceiling; writes bench.json, report.md, plot.png, the logs and the
# device facts into OUT_DIR.  Without a GPU it says so in one line and runs the CPU part.
# Sized for 10 minutes on a 16-core machine with one H200.
#
# This is for YOUR OWN GPU machine, online: the build downloads the sdist and pip's build tools
# (build isolation), and `make gpu-check` first runs `make setup` (the train extra pins
# torch==2.13.0).  A GPU machine with no package index and no network (such as the lent one:
# PyTorch 2.11 preinstalled, 64 MiB per call, 10 minutes per command) takes the device plan
# instead: `make gpu-kit` on a machine with the index, then the three calls of
# bench/gpu_plan/README.md.  Where a CUDA build is needed and no index answers, this script says so
# and stops before building, unless LLAMA_CPP_SRC is a local sdist and scikit-build-core is
# installed (then it builds with --no-build-isolation, offline).
#
# Environment (to shrink it, e.g. in CI):
#   GPU_CHECK_PYTHON   interpreter with llama-dflash installed (default: .venv/bin/python, else python3)
#   GPU_CHECK_TOKENS   generation lengths                 (default 512,1024,2048)
#   GPU_CHECK_DRAFTS   draft lengths                      (default 1,2,3,4,5,6,7,8,auto)
#   GPU_CHECK_RUNS     measured runs per setting          (default 1)
#   GPU_CHECK_MODEL / GPU_CHECK_DRAFT   the pair          (default: the embedded SmolLM2 pair)
#   GPU_CHECK_BENCH_ARGS  extra `llama-dflash bench` arguments
#   GPU_CHECK_TESTS    pytest arguments, or "skip"        (default: tests)
#   GPU_CHECK_BUILD    0: never (re)build the CUDA wheel  (default 1)
#   LLAMA_CPP_SRC      what pip builds: a local sdist path works offline (default llama-cpp-python==0.3.36)
#   CUDA_ARCH          CUDA architectures (default native: the local GPU)
set -uo pipefail

LLAMA_CPP_SRC=${LLAMA_CPP_SRC:-llama-cpp-python==0.3.36}

die() { echo "error: $*" >&2; exit 2; }

have() { command -v "$1" >/dev/null 2>&1; }

nvidia_gpu() { have nvidia-smi && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

cmake_args() {
  case "${1:-}" in
    cuda)
      have nvcc || [ -n "${CUDACXX:-}" ] ||
        die "GPU=cuda needs the CUDA toolkit: nvcc is not on PATH (install the CUDA toolkit, or set CUDACXX)"
      if [ -n "${CUDA_ARCH:-}" ]; then
        echo "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH}"
      else
        nvidia_gpu || die "GPU=cuda found nvcc but no NVIDIA GPU or driver (nvidia-smi -L lists none); to build for another machine set CUDA_ARCH, e.g. CUDA_ARCH=90"
        echo "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=native"
      fi ;;
    rocm)
      have hipconfig || die "GPU=rocm needs ROCm/HIP: hipconfig is not on PATH (install ROCm)"
      echo "-DGGML_HIP=on -DCMAKE_HIP_COMPILER=$(hipconfig -l)/clang${ROCM_ARCH:+ -DGPU_TARGETS=${ROCM_ARCH}}" ;;
    vulkan)
      have glslc || die "GPU=vulkan needs the Vulkan SDK: glslc (shader compiler) is not on PATH"
      echo "-DGGML_VULKAN=on" ;;
    metal)
      [ "$(uname -s)" = Darwin ] || die "GPU=metal needs macOS (this is $(uname -s))"
      echo "-DGGML_METAL=on" ;;
    *)
      die "GPU must be one of cuda, metal, vulkan, rocm (not '${1:-}')" ;;
  esac
}

if [ "${1:-}" = cmake-args ]; then
  cmake_args "${2:-}"
  exit 0
fi

cd "$(dirname "$0")/.." || exit 2
out=${1:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)
py=${GPU_CHECK_PYTHON:-}
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
t_start=$(date +%s)
step() { echo "[gpu-check +$(( $(date +%s) - t_start ))s] $*"; }

if nvidia_gpu; then
  gpu=1
  step "NVIDIA GPU: $(nvidia-smi -L | head -n 1)"
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
else
  gpu=0
  echo "no NVIDIA GPU found (nvidia-smi lists none): running the CPU part only"
fi

backend() {
  "$py" -c 'from llama_dflash.bench.backend import backend_info; print(backend_info().name)' 2>/dev/null
}

# whether pip reaches a package index (one small download, no retries)
index_answers() {
  local tmp rc
  tmp=$(mktemp -d)
  timeout 90 "$py" -m pip download -q --no-deps --no-cache-dir --retries 0 --timeout 15 -d "$tmp" \
    scikit-build-core >/dev/null 2>&1
  rc=$?
  rm -rf "$tmp"
  return $rc
}

if [ "$gpu" = 1 ] && [ "${GPU_CHECK_BUILD:-1}" != 0 ]; then
  if [ "$(backend)" = CUDA ]; then
    step "llama-cpp-python already runs on CUDA: no rebuild"
  else
    args=$(cmake_args cuda) || exit 2
    isolation=()
    if ! index_answers; then
      if [ -f "$LLAMA_CPP_SRC" ] && "$py" -c 'import scikit_build_core' 2>/dev/null; then
        step "no package index answers: building from $LLAMA_CPP_SRC with the installed build tools (--no-build-isolation)"
        isolation=(--no-build-isolation)
      else
        die "no package index answers from here, and building llama-cpp-python needs one (its sdist, pip's build tools). On a GPU machine without network take the device plan: 'make gpu-kit' on a machine with the index, then the three calls in bench/gpu_plan/README.md. (Or set LLAMA_CPP_SRC to a local sdist with scikit-build-core installed.)"
      fi
    fi
    step "building llama-cpp-python with CMAKE_ARGS='$args' (log: build.log)"
    CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$py" -m pip install --no-cache-dir \
      --force-reinstall --no-deps --no-binary llama-cpp-python ${isolation[@]+"${isolation[@]}"} "$LLAMA_CPP_SRC" \
      > "$out/build.log" 2>&1 || die "the CUDA build failed; see $out/build.log"
  fi
fi

"$py" - > "$out/backend.json" <<'EOF' || die "llama-dflash does not import with $py"
import json
from llama_dflash.bench.backend import backend_info
print(json.dumps(backend_info().to_dict(), indent=2))
EOF
step "backend: $(backend)"

status=0
tests=${GPU_CHECK_TESTS:-tests}
if [ "$tests" != skip ]; then
  step "test suite (every layer offloaded: n_gpu_layers -1), log: tests.log"
  # shellcheck disable=SC2086
  if "$py" -m pytest -q -ra $tests > "$out/tests.log" 2>&1; then
    step "tests: $(tail -n 1 "$out/tests.log")"
  else
    status=1
    step "tests FAILED: $(tail -n 1 "$out/tests.log")"
  fi
fi

step "benchmark: tokens ${GPU_CHECK_TOKENS:-512,1024,2048}, draft lengths ${GPU_CHECK_DRAFTS:-1,2,3,4,5,6,7,8,auto}"
bench=("$py" -m llama_dflash.cli bench --quiet --ignore-eos --oracle
       --sweep-max-tokens "${GPU_CHECK_TOKENS:-512,1024,2048}"
       --sweep-draft-tokens "${GPU_CHECK_DRAFTS:-1,2,3,4,5,6,7,8,auto}"
       --runs "${GPU_CHECK_RUNS:-1}" --n-gpu-layers -1
       --json "$out/bench.json" --report "$out/report.md" --plot "$out/plot.png")
[ -n "${GPU_CHECK_MODEL:-}" ] && bench+=(--model "$GPU_CHECK_MODEL")
[ -n "${GPU_CHECK_DRAFT:-}" ] && bench+=(--draft-model "$GPU_CHECK_DRAFT")
# shellcheck disable=SC2206
bench+=(${GPU_CHECK_BENCH_ARGS:-})
if "${bench[@]}" > "$out/bench.txt" 2> "$out/bench.log"; then
  step "benchmark done: $out/bench.txt"
else
  status=1
  step "benchmark FAILED: $(tail -n 3 "$out/bench.log" | tr '\n' ' ')"
fi
grep -E "best draft length|by default|oracle ceiling|predicted .* measured" "$out/bench.txt" 2>/dev/null | sed 's/^ */  /'
step "results in $out (bench.json, report.md, plot.png, bench.txt, tests.log, backend.json)"
exit $status
