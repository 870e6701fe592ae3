#!/usr/bin/env bash
# Creates .venv and installs everything the book and the tests need, from the
# project's own files. Safe to re-run: pip skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pip=".venv/bin/python -m pip --disable-pip-version-check -q"
$pip install --upgrade pip >/dev/null
# The CPU wheel first: anything that later asks for "torch" finds it satisfied
# instead of pulling a multi-GB CUDA build.
$pip install torch==2.13.0
$pip install -r requirements.txt
$pip install --no-deps -r requirements-nodeps.txt
$pip install --no-deps -e .
# MathJax for the offline book, from the npm registry (Node.js's npm).
if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
  (apt-get update -qq && apt-get install -y -qq npm >/dev/null) || true
fi
bash scripts/fetch_js.sh
if [ "${1:-}" = "--test" ]; then
  $pip install -r requirements-test.txt
  # Debian's Chromium drives the offline browser test; Playwright's own
  # browser download cannot work without the network.
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ]; then
      (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "warning: could not install chromium; the browser test will be skipped" >&2
    else
      echo "warning: chromium is not installed (apt-get install chromium); the browser test will be skipped" >&2
    fi
  fi
fi
