#!/usr/bin/env bash
# Create benchmarks/.venv-plot with matplotlib, for benchmarks/plot.py (idempotent).
# Kept apart from stepstone's venv: matplotlib is never a dependency of stepstone.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-plot"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    "$venv/bin/python" -m pip install --quiet 'matplotlib>=3.8,<4'
fi
"$venv/bin/python" -c 'import matplotlib; print("plot venv ready:", matplotlib.__version__)'
