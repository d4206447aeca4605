#!/usr/bin/env bash
# The test suite: lint, unit, API (SQLite and PostgreSQL), integration against real Open vSwitch.
# With CI=true a missing prerequisite (PostgreSQL, root, OVS) is a failure; elsewhere it is said loudly.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export TIANJI_PG_URL=${TIANJI_PG_URL:-postgresql+psycopg://postgres@127.0.0.1:5432/postgres}

echo "==> ruff"
.venv/bin/ruff check . || exit 1

if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  export TIANJI_TEST_PG=1
elif [ "${CI:-}" = "true" ]; then
  echo "FAIL: PostgreSQL is not reachable at 127.0.0.1:5432, and CI=true requires the PostgreSQL half of the API tests." >&2
  exit 1
else
  echo "#####################################################################################"
  echo "# WARNING: PostgreSQL is not reachable at 127.0.0.1:5432: running the SQLite half of   #"
  echo "# the API tests only. Start PostgreSQL (trust auth for 127.0.0.1) to run both.        #"
  echo "#####################################################################################"
  export TIANJI_TEST_PG=0
fi

echo "==> pytest"
# the rolling upgrade brings up its own cluster on the addresses the scenarios' cluster holds: a run of its own
$PY -m pytest -q -p no:cacheprovider tests --ignore=tests/upgrade "$@" || exit 1
[ $# -gt 0 ] && exit 0  # a selection was asked for
echo "==> pytest tests/upgrade (a rolling upgrade from the previous release, under traffic)"
exec $PY -m pytest -q -s -p no:cacheprovider tests/upgrade
