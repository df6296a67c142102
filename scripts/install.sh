#!/usr/bin/env bash
# The one install path of fedmem. `make demo` and `make test` both call it.
# Idempotent: it reinstalls only when pyproject.toml or this script changed since the
# last successful install (stamp file .venv/.fedmem-installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv
STAMP=$VENV/.fedmem-installed
want=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "fedmem: environment up to date ($VENV)"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "fedmem: creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
echo "fedmem: installing dependencies into $VENV (first time: about 2-3 minutes)"
"$VENV/bin/pip" install -q --upgrade pip setuptools wheel
# torch is pinned exactly (2.13.0, CPU build); any other pin pulls a multi-GB CUDA build.
"$VENV/bin/pip" install -q -e ".[test]"
# CrypTen: its metadata names `sklearn` (dead) and torchvision; install it alone.
"$VENV/bin/pip" install -q --no-deps "crypten==0.4.1"
"$VENV/bin/python" -c "import fedmem._crypten as c; c.crypten" >/dev/null
echo "$want" > "$STAMP"
echo "fedmem: environment ready"
