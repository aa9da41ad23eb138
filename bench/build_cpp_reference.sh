#!/usr/bin/env bash
# (The project's copy of ../shared/tools/build-cpp-reference.sh: `make test` and CI run it, so that no
# C++ parity test skips there.  The build is cached in OUT_DIR: a second run returns at once.)
# Builds llama.cpp's own C++ speculative driver (llama-speculative-simple), llama-bench, llama-server and
# test-llama-archs (writes a random model of any arch: `test-llama-archs -a '^qwen35$' -o DIR`) from the
# llama.cpp sources vendored in the llama-cpp-python sdist we depend on, so that our Python engine
# can be compared with the C++ one on identical code (llama-server: the reference for serving many
# requests at once, `-np N`, with `--spec-type draft-dflash|draft-dspark|ngram-*`). CPU build by default; pass extra CMake flags
# in CMAKE_ARGS (e.g. -DGGML_CUDA=on). Takes 10-15 minutes on 2 cores the first time; the sources stay in
# OUT_DIR/src, so a later call that needs a new target builds only what changed.
#   usage: build-cpp-reference.sh [OUT_DIR]    (default: ~/.cache/llama-cpp-reference)
# Prints the directory holding the binaries on its last line.
set -euo pipefail
version=0.3.36
out=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/llama-cpp-reference}
bin="$out/build/bin"
targets="llama-speculative-simple llama-bench llama-server test-llama-archs"
have=1
for t in $targets; do [ -x "$bin/$t" ] || have=0; done
if [ $have -eq 1 ] && "$bin/llama-bench" --help >/dev/null 2>&1; then
  echo "$bin"; exit 0
fi
src="$out/src/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$version" >&2
  mkdir -p "$out/src"
  tar xzf "$work"/llama_cpp_python-$version.tar.gz -C "$out/src"
fi
# a build configured from another source folder (older versions of this script used a temporary one) cannot be reused
if [ -f "$out/build/CMakeCache.txt" ] && ! grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$src\$" "$out/build/CMakeCache.txt"; then
  rm -rf "$out/build"
fi
# build inside OUT_DIR: the binaries find their shared libraries next to them, in $bin
cmake -S "$src" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=ON ${CMAKE_ARGS:-} >&2
cmake --build "$out/build" -j"$(nproc)" --target $targets >&2
echo "$bin"
