#!/usr/bin/env bash
# Create benchmarks/.venv-peers and install the pinned peers into it (idempotent).
# Usage: bash benchmarks/peers/setup.sh   then
#        benchmarks/.venv-peers/bin/python benchmarks/peers/peers.py [--quick] [--json] [--verify]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$(dirname "$here")/.venv-peers"
req="$here/requirements.txt"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
stamp="$venv/.peers-requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
        && "$venv/bin/python" -c 'import langgraph.checkpoint.sqlite, langgraph.checkpoint.sqlite.aio, langgraph.checkpoint.postgres.aio, aiosqlite, psycopg, burr.core, dbos' 2>/dev/null; then
    echo "peers venv up to date: $venv"
    exit 0
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$req"
"$venv/bin/python" -c 'import langgraph.checkpoint.sqlite, langgraph.checkpoint.sqlite.aio, langgraph.checkpoint.postgres.aio, aiosqlite, psycopg, burr.core, dbos'
echo "$want" > "$stamp"
"$venv/bin/python" -m pip freeze | grep -iE '^(langgraph|apache-burr|dbos|sqlalchemy|langchain-core|aiosqlite|psycopg)' || true
echo "peers venv ready: $venv"
