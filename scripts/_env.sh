# Sourced by scripts/*: a virtualenv in .venv with the project installed, refreshed when
# pyproject.toml or sdk/pyproject.toml changes. Set BLEEDWATCH_PYTHON to choose the interpreter
# (default python3). The SDK (sdk/, bleedwatch-sdk) is installed editable from its folder in the
# same pip call, so the server's `bleedwatch-sdk` requirement is met by this checkout's copy.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
extras="${1:-}"
stamp="$VENV/.installed-$(cat pyproject.toml sdk/pyproject.toml | sha256sum | cut -c1-16)${extras:+-$extras}"
if [ ! -f "$stamp" ]; then
  echo "setting up $VENV ..." >&2
  [ -x "$VENV/bin/python" ] || "${BLEEDWATCH_PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # The server's distribution was called `bleedwatch` before `bleedwatch-server`: an old install goes first.
  "$VENV/bin/python" -m pip uninstall --quiet --yes bleedwatch 2>/dev/null || true
  "$VENV/bin/python" -m pip install --quiet -e ./sdk -e ".${extras:+[$extras]}"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
