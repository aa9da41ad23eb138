#!/usr/bin/env bash
# Device call 1 of 3 (bench/gpu_plan/README.md): carry gpu-kit/call1.
#
# Gathers the call's pieces; makes the plan's venv (STATE/venv) chained to the device's own
# packages (/opt/torch/.venv: PyTorch 2.11 and the rest stay the device's, nothing is installed
# over them); installs from the kit with no index: the build tools, llama-cpp-python's Python
# package (its sdist, trimmed, with LLAMA_BUILD=OFF: the library comes from our own build), our
# package from the tree with its extras; then compiles llama.cpp ONCE from the trimmed source for
# CUDA sm_90 only (libllama, libggml-cuda and llama-speculative-simple in one build tree, the
# settings llama-cpp-python's CMakeLists sets) and puts the libraries where llama_cpp loads them.
# A compile cut by the budget is finished by step 2.  Back in OUT: build.json, build.log.gz,
# configure.log, plan.log.
STEP=step1
STEP_SECONDS=360
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

log "machine: $(nproc) cores, $(nvidia-smi -L 2>/dev/null | head -n 1 || echo 'no NVIDIA GPU (nvidia-smi lists none)')"
command -v nvcc >/dev/null && log "nvcc: $(nvcc --version | tail -n 1)"
log "cmake $(cmake --version | head -n 1 | awk '{print $3}'), ninja $(ninja --version 2>/dev/null || echo missing), base python $("$BASE_PYTHON" -V 2>&1)"
rm -f "$STATE"/*.done "$STATE/build.json" "$STATE/build.log"
gather_pieces
[ -f "$PIECES/wheels/llama_cpp_python-0.3.36.tar.gz" ] ||
  die "the trimmed llama-cpp-python source is not here: carry gpu-kit/call1 with step 1"
fact mode "\"$BUILD_MODE\""
fact jobs "$JOBS"
fact kit_commit "\"$("$BASE_PYTHON_FOR_TOOLS" -c 'import json,sys; print(json.load(open(sys.argv[1]))["commit"])' "$PIECES/manifest.json")\""

# ---- the venv: ours, chained to the device's packages --------------------------------------------
log "venv $VENV from $BASE_PYTHON"
rm -rf "$VENV"
"$BASE_PYTHON" -m venv --without-pip "$VENV" || die "$BASE_PYTHON cannot make a venv"
if [ -n "${GPU_PLAN_SITE:-}" ]; then
  chain=$(echo "$GPU_PLAN_SITE" | tr ':' '\n')
else
  # every site folder the device's interpreter sees (a venv made from a venv's python would see
  # only the base interpreter's: hence the chain)
  chain=$("$BASE_PYTHON" -c 'import sys; print("\n".join(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))))')
fi
site=$(venv_site)
echo "$chain" > "$STATE/chain"
: > "$site/_gpu_plan_chain.pth"
while IFS= read -r d; do
  [ -n "$d" ] && printf 'import site; site.addsitedir(%s)\n' "$("$BASE_PYTHON_FOR_TOOLS" -c 'import sys; print(repr(sys.argv[1]))' "$d")" >> "$site/_gpu_plan_chain.pth"
done <<< "$chain"
"$VPY" -m pip --version >/dev/null 2>&1 || die "pip is not importable through the chained site folders ($chain)"
log "chained: $(echo $chain)"

PIP=("$VPY" -m pip --disable-pip-version-check --no-input install -q --no-index --no-cache-dir
     --find-links "$PIECES/wheels")
tools=$("$VPY" -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["build_tools"]))' "$PIECES/manifest.json")
log "installing the build tools from the kit: $tools"
# shellcheck disable=SC2086
within 60 "${PIP[@]}" $tools > "$STATE/install.log" 2>&1 || { tail -n 20 "$STATE/install.log"; die "installing the build tools failed"; }

log "installing llama-cpp-python's Python package (LLAMA_BUILD=OFF: no compile)"
# by name, from --find-links (a path would be recorded as a direct URL, which the next install's
# `llama-cpp-python[server]==0.3.36` then cannot reuse)
within 60 env CMAKE_ARGS="-DLLAMA_BUILD=OFF" "${PIP[@]}" --no-build-isolation "llama-cpp-python==0.3.36" \
  >> "$STATE/install.log" 2>&1 ||
  { tail -n 20 "$STATE/install.log"; die "installing llama-cpp-python from the trimmed sdist failed (install.log)"; }

log "installing llama-dflash from the tree with its extras ($("$VPY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["extras"])' "$PIECES/manifest.json"))"
extras=$("$VPY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["extras"])' "$PIECES/manifest.json")
# our wheel is built here from the tree (setuptools from the kit): what runs is what was carried
(cd "$ROOT" && within 60 "${PIP[@]}" --no-build-isolation ".[$extras]") >> "$STATE/install.log" 2>&1 ||
  { tail -n 20 "$STATE/install.log"; die "installing llama-dflash from the kit failed (install.log: a missing wheel means 'make gpu-kit' must run again)"; }
touch "$STATE/venv.done"
fact install_seconds "$(( $(date +%s) - T0 ))"

# ---- llama.cpp, compiled once ----------------------------------------------------------------------
unpack_source
configure_llama
if [ "$BUILD_MODE" = cuda ]; then
  if compile_llama 25; then
    install_libs
    touch "$STATE/step1.done"
  fi
else
  log "GPU_PLAN_BUILD=reuse: no compile (the trimmed source was configured); libraries from $GPU_PLAN_REUSE_LIBS"
  install_libs
  touch "$STATE/step1.done"
fi

cp "$STATE/build.json" "$OUT/"
[ -f "$STATE/build.log" ] && gzip -c "$STATE/build.log" > "$OUT/build.log.gz"
give "$STATE/configure.log" "$STATE/install.log"
finish
[ -f "$STATE/step1.done" ] || exit 3  # the compile goes on in step 2
