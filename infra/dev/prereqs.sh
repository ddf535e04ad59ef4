#!/usr/bin/env bash
# What a make target needs on this machine, checked before the target starts: for each thing
# missing, one line naming what to install; exit 1. It installs nothing.
#   prereqs.sh python PY        a Python 3.11-3.13 with venv and ensurepip (PY: its command)
#   prereqs.sh java             Java 17+ (the Kafka broker)
#   prereqs.sh mvn              Maven (fetches the Kafka jars)
#   prereqs.sh go MIN           Go MIN or newer (the test tools built from the Go module proxy)
#   prereqs.sh promtool CMD     promtool (the metric lint and the alert rules' tests)
set -uo pipefail
missing=0
say() { echo "missing prerequisite: $*" >&2; missing=1; }
debian() { [ -r /etc/debian_version ]; }

while [ $# -gt 0 ]; do
  what=$1; shift
  case $what in
  python)
    py=${1:-}; shift
    if [ -z "$py" ]; then
      say "no Python 3.11, 3.12 or 3.13 on the PATH (tried python3, python3.13, python3.12," \
          "python3.11): install one$(debian && echo ' (Debian: apt install python3 python3-venv)')," \
          "or name it with PY=/path/to/python3.x"
    elif ! "$py" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
      say "PY=$py is not Python 3.11-3.13 ($("$py" --version 2>&1 | head -1))"
    elif ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
      say "$py cannot make a virtualenv (no venv/ensurepip)$(debian && echo ': apt install python3-venv')"
    fi ;;
  java)
    if ! command -v java >/dev/null; then
      say "java: the Kafka broker needs Java 17 or newer$(debian && echo ' (Debian: apt install default-jre-headless)')"
    else
      v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9][0-9.]*\).*/\1/p' | head -1)
      major=${v%%.*}; [ "$major" = 1 ] && major=$(echo "$v" | cut -d. -f2)
      [ "${major:-0}" -ge 17 ] 2>/dev/null || say "java $v is older than 17, which the Kafka broker needs"
    fi ;;
  mvn)
    command -v mvn >/dev/null || say "mvn: Maven fetches the Kafka jars from Maven Central$(debian && echo ' (Debian: apt install maven)')" ;;
  go)
    min=${1:?go needs a minimum version}; shift
    if ! command -v go >/dev/null; then
      say "go: Go $min or newer builds the test tools from the Go module proxy (https://go.dev/dl/)"
    else
      have=$(go env GOVERSION 2>/dev/null); have=${have#go}
      if [ "$(printf '%s\n%s\n' "$min" "$have" | sort -V | head -1)" != "$min" ]; then
        say "go $have is older than $min, which the pinned Go modules need (https://go.dev/dl/)"
      fi
    fi ;;
  promtool)
    cmd=${1:-promtool}; shift
    command -v "$cmd" >/dev/null || say "$cmd: promtool lints /metrics and tests the alert rules" \
      "$(debian && echo '(Debian: apt install prometheus, which ships it)')," \
      "or name one with PROMTOOL=/path/to/promtool" ;;
  *) echo "prereqs.sh: unknown prerequisite $what" >&2; exit 2 ;;
  esac
done
exit $missing
