# Sourced by bench/gpu_plan/step*.sh: settings, logging, the time budget, the kit's pieces.
#
# Environment (defaults are the device's; the CPU rehearsal sets the others, see README.md):
#   GPU_PLAN_KIT       the kit as carried (default gpu-kit/ in the tree: each call carries one callN/)
#   GPU_PLAN_STATE     where the plan keeps what later calls need, outside the tree (default /tmp/gpu-plan);
#                      it outlives a call only while the machine stays warm
#   GPU_PLAN_PYTHON    the interpreter whose packages the plan's venv chains (default /opt/torch/.venv/bin/python3)
#   GPU_PLAN_SITE      the folder(s) chained instead of that interpreter's site-packages (':'-separated)
#   GPU_PLAN_SECONDS   this call's time budget; every part's timeout comes out of it (default: the step's
#                      STEP_SECONDS, 360 / 150 / 200 for steps 1 / 2 / 3: README.md sizes them to the device time)
#   OUT                where the files that come back go (the device tool sets it; default STATE/out/STEP)
set -euo pipefail

PLAN_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$PLAN_DIR/../.." && pwd)
KIT=${GPU_PLAN_KIT:-$ROOT/gpu-kit}
STATE=${GPU_PLAN_STATE:-/tmp/gpu-plan}
BASE_PYTHON=${GPU_PLAN_PYTHON:-/opt/torch/.venv/bin/python3}
BUDGET=${GPU_PLAN_SECONDS:-${STEP_SECONDS:-300}}
VENV=$STATE/venv
VPY=$VENV/bin/python
PIECES=$STATE/kit          # every carried piece, checked, gathered over the calls
RESULTS=$STATE/results     # what later calls report again
T0=$(date +%s)
mkdir -p "$STATE" "$PIECES" "$RESULTS"
OUT=${OUT:-$STATE/out/$STEP}
mkdir -p "$OUT"
PLAN_LOG=$STATE/plan.log

log() { echo "[$STEP +$(( $(date +%s) - T0 ))s] $*" | tee -a "$PLAN_LOG"; }
die() { echo "[$STEP] error: $*" | tee -a "$PLAN_LOG" >&2; cp "$PLAN_LOG" "$OUT/plan.log" 2>/dev/null || true; exit 2; }
# seconds left in this call's budget, less a reserve for what comes after
left() { echo $(( BUDGET - ($(date +%s) - T0) - ${1:-0} )); }
# run a part under the time left (less RESERVE seconds): `within RESERVE cmd...`; 124 if cut
within() {
  local reserve=$1; shift
  local t; t=$(left "$reserve")
  if [ "$t" -lt 5 ]; then log "no time left for: $*"; return 124; fi
  timeout --kill-after=10 "$t" "$@"
}

# The kit's manifest: the one carried in this call, else the one gathered earlier.
manifest() {
  local m
  for m in "$KIT"/call*/manifest.json "$PIECES/manifest.json"; do
    [ -f "$m" ] && { echo "$m"; return 0; }
  done
  return 1
}

# Gather the pieces this call carries (any gpu-kit/callN/ present) into STATE, checking each
# against the manifest's sha256.
gather_pieces() {
  local m d n=0
  m=$(manifest) || die "no kit here: carry gpu-kit/call1 (made by 'make gpu-kit') with this call"
  cp "$m" "$PIECES/manifest.json.new" && mv "$PIECES/manifest.json.new" "$PIECES/manifest.json"
  for d in "$KIT"/call*/; do
    [ -d "$d" ] || continue
    (cd "$d" && find . -type f ! -name manifest.json -print0) | while IFS= read -r -d '' f; do
      mkdir -p "$PIECES/$(dirname "$f")"
      cp "$d/$f" "$PIECES/$f"
    done
    n=$((n + 1))
  done
  "$BASE_PYTHON_FOR_TOOLS" - "$PIECES" <<'EOF' || die "a carried piece does not match the kit's manifest (see above): run 'make gpu-kit' again"
import hashlib, json, os, sys
pieces = sys.argv[1]
m = json.load(open(os.path.join(pieces, "manifest.json")))
files = [(w["file"], w["sha256"]) for w in m["wheels"]] + [(m["llama_cpp_python"]["file"], m["llama_cpp_python"]["sha256"])]
files += [(p["file"], p["sha256"]) for p in m["model"]["parts"]]
bad = []
for rel, want in files:
    path = os.path.join(pieces, rel)
    if os.path.exists(path):
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        if h.hexdigest() != want:
            bad.append(rel)
for rel in bad:
    print(f"  {rel}: sha256 differs from the manifest", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
  log "kit: $n call folder(s) carried; pieces gathered in $PIECES"
}

# any python that can run the little helpers (the venv's once it exists)
BASE_PYTHON_FOR_TOOLS=$BASE_PYTHON
[ -x "$BASE_PYTHON_FOR_TOOLS" ] || BASE_PYTHON_FOR_TOOLS=python3

# Copy a file into OUT (what comes back: at most 8 files, 16 MiB each)
give() { local f; for f in "$@"; do [ -f "$f" ] && cp "$f" "$OUT/"; done; return 0; }

finish() {
  log "done in $(( $(date +%s) - T0 ))s; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
  cp "$PLAN_LOG" "$OUT/plan.log"
}

# ---- the build (step 1; step 2 finishes it when step 1's time ran out) ----------------------------
#   GPU_PLAN_BUILD       cuda: compile the trimmed llama.cpp (default); reuse: compile nothing, copy the
#                        libraries of GPU_PLAN_REUSE_LIBS (the CPU rehearsal: an installed llama_cpp/lib)
#   GPU_PLAN_CMAKE_ARGS  the backend's CMake flags (default: CUDA for sm_90 only, see step1_build.sh)
#   GPU_PLAN_JOBS        parallel compile jobs (default: every core)
#   GPU_PLAN_CPP_BIN     reuse mode: a folder holding llama-speculative-simple (else no C++ driver)
BUILD_MODE=${GPU_PLAN_BUILD:-cuda}
CMAKE_BACKEND=${GPU_PLAN_CMAKE_ARGS-"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CUDA_NCCL=OFF"}
JOBS=${GPU_PLAN_JOBS:-$(nproc)}
SRC=$STATE/src/llama_cpp_python-0.3.36
BUILD=$STATE/build
# what llama-cpp-python's own CMakeLists sets (shared libraries, llama-common, no curl) comes from
# its CMakeLists itself: we configure the sdist's top directory, as pip would, and add the examples
# (llama-speculative-simple) and leave out mtmd (multimodal, never loaded by us)
CMAKE_COMMON="-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_EXAMPLES=ON -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF"

case "$BUILD_MODE" in cuda|reuse) ;; *) die "GPU_PLAN_BUILD must be cuda or reuse, not '$BUILD_MODE'";; esac

# json facts of the build, accumulated over the steps
fact() { "$BASE_PYTHON_FOR_TOOLS" - "$STATE/build.json" "$1" "$2" <<'PYEOF'
import json, os, sys
path, key, value = sys.argv[1:4]
d = json.load(open(path)) if os.path.exists(path) else {}
try:
    d[key] = json.loads(value)
except ValueError:
    d[key] = value
json.dump(d, open(path, "w"), indent=2)
PYEOF
}

unpack_source() {
  [ -f "$STATE/src.done" ] && return 0
  rm -rf "$STATE/src" && mkdir -p "$STATE/src"
  tar xzf "$PIECES/wheels/llama_cpp_python-0.3.36.tar.gz" -C "$STATE/src"
  touch "$STATE/src.done"
}

configure_llama() {
  [ -f "$STATE/configure.done" ] && return 0
  local t=$(date +%s) extra=""
  log "cmake configure: $CMAKE_COMMON $CMAKE_BACKEND (log: configure.log)"
  # shellcheck disable=SC2086
  if ! within 30 cmake -S "$SRC" -B "$BUILD" $CMAKE_COMMON $CMAKE_BACKEND > "$STATE/configure.log" 2>&1; then
    if grep -q 'CUDA::cublas\|CUDA::cuda_driver' "$STATE/configure.log"; then
      extra=$(cuda_fallback_args) || { tail -n 25 "$STATE/configure.log"; die "cmake configure failed: the CUDA toolkit has no cuBLAS or no driver library, and none was found elsewhere (configure.log)"; }
      log "the CUDA toolkit lacks cuBLAS or the driver library: configuring again with $extra"
      rm -rf "$BUILD"
      # shellcheck disable=SC2086
      within 30 cmake -S "$SRC" -B "$BUILD" $CMAKE_COMMON $CMAKE_BACKEND $extra > "$STATE/configure.log" 2>&1 ||
        { tail -n 25 "$STATE/configure.log"; die "cmake configure failed (configure.log)"; }
    else
      tail -n 25 "$STATE/configure.log"; die "cmake configure failed (configure.log)"
    fi
  fi
  fact configure_seconds "$(( $(date +%s) - t ))"
  fact cmake_args "\"$CMAKE_COMMON $CMAKE_BACKEND $extra\""
  touch "$STATE/configure.done"
}

# Where the toolkit has no cuBLAS (nvcc alone, as on some images) or no libcuda to link against,
# take them from the pip packages PyTorch brought (nvidia/... in a chained site folder) and the
# driver's own library; prints the CMake flags, fails when nothing is found.  The libraries are
# linked beside ours at install_libs so that they load at run time.
cuda_fallback_args() {
  local sites d inc="" blas="" blaslt="" drv="" args=""
  sites=$(cat "$STATE/chain" 2>/dev/null; venv_site)
  for d in $sites; do
    [ -d "$d/nvidia" ] || continue
    [ -n "$inc" ] || inc=$(find -L "$d/nvidia" -name cublas_v2.h -print -quit 2>/dev/null | xargs -r dirname)
    [ -n "$blas" ] || blas=$(find -L "$d/nvidia" -name 'libcublas.so*' -print -quit 2>/dev/null)
    [ -n "$blaslt" ] || blaslt=$(find -L "$d/nvidia" -name 'libcublasLt.so*' -print -quit 2>/dev/null)
  done
  for d in ${GPU_PLAN_DRIVER_DIRS:-/usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/compat}; do
    [ -n "$drv" ] || drv=$(ls "$d"/libcuda.so* 2>/dev/null | head -n 1)
  done
  local root
  root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  if ! ls "$root"/lib64/libcublas.so "$root"/targets/*/lib/libcublas.so >/dev/null 2>&1; then
    [ -n "$inc" ] && [ -n "$blas" ] && [ -n "$blaslt" ] || return 1
    args="-DCUDA_cublas_LIBRARY=$blas -DCUDA_cublasLt_LIBRARY=$blaslt -DCMAKE_CUDA_FLAGS=-I$inc"
    printf '%s\n' "$blas" "$blaslt" > "$STATE/runtime_libs"
  fi
  if ! ls "$root"/lib64/stubs/libcuda.so "$root"/targets/*/lib/stubs/libcuda.so "$root"/lib64/libcuda.so >/dev/null 2>&1; then
    [ -n "$drv" ] || return 1
    args="$args -DCUDA_cuda_driver_LIBRARY=$drv"
  fi
  [ -n "$args" ] || return 1
  echo "$args"
}

# compile what the plan runs: libllama + libggml (+ the backend) and llama-speculative-simple; a
# build cut by the time budget is resumed by the next call (ninja keeps what it made)
compile_llama() {
  local reserve=$1 t rc=0
  [ -f "$STATE/compile.done" ] && return 0
  t=$(date +%s)
  log "compiling with $JOBS jobs (log: build.log; $(left "$reserve")s left for it)"
  within "$reserve" cmake --build "$BUILD" -j "$JOBS" --target llama llama-speculative-simple >> "$STATE/build.log" 2>&1 || rc=$?
  fact build_seconds "$(( $("$BASE_PYTHON_FOR_TOOLS" -c "import json,sys; print(json.load(open(sys.argv[1])).get('build_seconds', 0))" "$STATE/build.json") + $(date +%s) - t ))"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    log "the compile did not finish in this call's budget: the next step continues it (machine must stay warm)"
    return 124
  elif [ $rc -ne 0 ]; then
    tail -n 30 "$STATE/build.log"; die "the compile failed (build.log)"
  fi
  log "compiled: $(grep -c '^\[' "$STATE/build.log" || true) build steps"
  touch "$STATE/compile.done"
}

# the site-packages folder of the plan's venv, and llama_cpp's lib folder in it
venv_site() { "$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

install_libs() {
  local lib from
  lib="$(venv_site)/llama_cpp/lib"
  mkdir -p "$lib"
  if [ "$BUILD_MODE" = reuse ]; then
    from=${GPU_PLAN_REUSE_LIBS:?GPU_PLAN_BUILD=reuse needs GPU_PLAN_REUSE_LIBS: a folder with libllama.so and libggml*.so}
  else
    from=$BUILD/bin
  fi
  ls "$from"/libllama.so* >/dev/null 2>&1 || die "no libllama.so in $from"
  cp -a "$from"/libllama.so* "$from"/libggml*.so* "$lib/"
  if [ -f "$STATE/runtime_libs" ]; then  # cuBLAS from a pip package: found beside ours ($ORIGIN)
    while IFS= read -r f; do
      ln -sf "$f" "$lib/$(basename "$f")"
      [ -d "$BUILD/bin" ] && ln -sf "$f" "$BUILD/bin/$(basename "$f")"
    done < "$STATE/runtime_libs"
  fi
  fact libraries "\"$(cd "$lib" && ls | tr '\n' ' ')\""
  local cpp=""
  if [ "$BUILD_MODE" = reuse ]; then
    [ -n "${GPU_PLAN_CPP_BIN:-}" ] && [ -x "$GPU_PLAN_CPP_BIN/llama-speculative-simple" ] && cpp=$GPU_PLAN_CPP_BIN/llama-speculative-simple
  else
    cpp=$BUILD/bin/llama-speculative-simple
  fi
  echo "$cpp" > "$STATE/cpp_bin"
  "$VPY" - > "$STATE/backend.json" <<'PYEOF' || die "llama_cpp or llama_dflash does not load in the plan's venv"
import json
from llama_dflash.bench.backend import backend_info
print(json.dumps(backend_info().to_dict(), indent=2))
PYEOF
  backend=$("$VPY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["backend"])' "$STATE/backend.json")
  fact backend "\"$backend\""
  log "llama.cpp loads in the plan's venv: backend $backend; C++ driver: ${cpp:-none}"
  if [ "$BUILD_MODE" = cuda ] && [ "$backend" != CUDA ]; then
    die "the build runs on $backend, not CUDA (backend.json)"
  fi
}

# step 2 and 3: finish what step 1 could not (the compile, the libraries)
finish_build() {
  need_venv
  [ -f "$STATE/step1.done" ] && return 0
  log "step 1 left the build unfinished: continuing it"
  compile_llama "$1" || die "the compile is still not finished: run this step again right away (the machine must stay warm)"
  install_libs
  touch "$STATE/step1.done"
}

need_venv() {
  [ -x "$VPY" ] && [ -f "$STATE/venv.done" ] ||
    die "step 1's venv is not in $STATE: the machine went cold since step 1 (or step 1 did not run). Run step1_build.sh again, then this step right after it"
}
