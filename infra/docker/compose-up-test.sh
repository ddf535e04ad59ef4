#!/usr/bin/env bash
# `make compose-up-test`: docker-compose.yml with docker-compose.local.yml on the local engine
# (images from `make images`): up, infra/docker/compose/check.py (targets flow, Prometheus has
# every target up, the Grafana dashboard where Grafana runs), then down, whatever happened.
# Usage: compose-up-test.sh COMPOSE PYTHON KAFKA_VERSION  (env: DOCKER_HOST;
# SURPLUS_COMPOSE_GRAFANA=1 adds the grafana profile and its check, for an engine that has a
# Grafana image)
set -euo pipefail
compose_bin=${1:?compose binary}
python=${2:?python}
kafka_version=${3:?kafka version}
cd "$(dirname "$0")/../.."
grep -q "image: surplus-kafka:$kafka_version\$" docker-compose.local.yml || {
  echo "docker-compose.local.yml: the kafka image is not surplus-kafka:$kafka_version (the pom's)" >&2
  exit 1; }
project=surplus-local
compose=("$compose_bin" -p "$project" -f docker-compose.yml -f docker-compose.local.yml)
checks=()
if [ "${SURPLUS_COMPOSE_GRAFANA:-}" = 1 ]; then
  compose+=(--profile grafana); checks+=(--grafana http://127.0.0.1:23000)
fi
for port in 29092 29093 28081 28082 28083 29101 29102 29103 29090; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "127.0.0.1:$port is taken: docker-compose.local.yml needs it" >&2; exit 1; fi
done
down() {
  local t0=$SECONDS
  "${compose[@]}" down --volumes --remove-orphans --timeout 10 >/dev/null 2>&1 || true
  echo "down in $((SECONDS - t0)) s"
}
trap down EXIT
t0=$SECONDS
rc=0
mkdir -p out/compose
"${compose[@]}" up -d >out/compose/up.log 2>&1 || { rc=$?; cat out/compose/up.log; }
"${compose[@]}" ps --all --format 'table {{.Service}}\t{{.Image}}\t{{.Status}}'
echo "up in $((SECONDS - t0)) s"
if [ $rc = 0 ]; then "$python" infra/docker/compose/check.py "${checks[@]}" || rc=$?; fi
if [ "${SURPLUS_COMPOSE_GRAFANA:-}" != 1 ]; then
  echo "skip Grafana: no Grafana image can be had here (no registry, no Debian package, its Go" \
       "source may not be used); SURPLUS_COMPOSE_GRAFANA=1 checks it where one exists"
fi
if [ $rc != 0 ]; then
  "${compose[@]}" ps --all
  "${compose[@]}" logs --no-color --tail 30
fi
exit $rc
