#!/usr/bin/env bash
# Builds the local images with no registry, on the debootstrapped base (base-image.sh):
#   surplus-kafka:$KAFKA_VERSION  the embedded broker's jars (.kafka/libs) + Debian's OpenJDK 17
#   surplus:local                 control plane, scheduler, load generator, topic setup
#   surplus-worker:local          the workers (torch)
#   surplus-worker-cuda:local     the workers on GPU nodes (torch whole), only with `cuda`
#   surplus-prometheus:local      Debian's prometheus package
# Usage: images.sh KAFKA_VERSION [kafka|all|cuda]   (env: DOCKER_HOST, PIP, SURPLUS_IMAGE_CACHE)
# pip installs from a wheelhouse (made by the host's pip from requirements.lock) served on
# 127.0.0.1 for the length of the build; every build is `docker build --network host`. The
# third-party layers (Dockerfile stages deps and worker-deps) are saved under the cache
# (~/.cache/surplus/images, keyed by what they are built from) and loaded into a fresh engine, so
# a fresh clone rebuilds only the layers with the source; without the cache all is built anew.
set -euo pipefail
kafka_version=${1:?kafka version}
which=${2:-all}
cd "$(dirname "$0")/../.."
pip=${PIP:-.venv/bin/pip}
cache=${SURPLUS_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/surplus}
base=surplus-base:bookworm
export DOCKER_BUILDKIT=0  # the classic builder: no buildx plugin is needed
mkdir -p .docker
have() { docker image inspect "$1" >/dev/null 2>&1; }
build() {
  local t0=$SECONDS tag=$1; shift
  # Quiet unless it fails (the classic builder's deprecation notice aside).
  docker build -q --network host -t "$tag" "$@" >/dev/null 2>.docker/build.log \
    || { grep -v -e DEPRECATED -e BuildKit -e environment-variable .docker/build.log >&2; return 1; }
  docker image inspect -f '{{.Size}}' "$tag" \
    | awk -v t="$tag" -v s=$((SECONDS - t0)) '{printf "  %-28s %5.0f MB  built in %d s\n", t, $1/1e6, s}'
}

# The third-party layers from the cache, with the base they were built on (an imported base
# gets a new image ID each time, which the build cache would not match).
key=$( (cat requirements.lock pyproject.toml infra/docker/requirements.py infra/docker/Dockerfile
       echo "${SURPLUS_WHEELS_PORT:-29480}") | sha256sum | cut -c1-12)
saved=$cache/images/deps-$key.tar
if [ "$which" != kafka ] && ! have "surplus-deps:$key" && [ -s "$saved" ]; then
  t0=$SECONDS; docker load -q -i "$saved" >/dev/null
  echo "  $base, surplus-deps:$key, surplus-worker-deps:$key loaded from $saved in $((SECONDS - t0)) s"
fi

infra/docker/base-image.sh "$base"

ctx=.docker/context/kafka
rm -rf "$ctx" && mkdir -p "$ctx"
cp -r .kafka/libs "$ctx/libs" && rm -f "$ctx/libs/.fetched"
cp infra/kafka/log4j2.properties infra/docker/kafka/entrypoint.sh "$ctx/"
build "surplus-kafka:$kafka_version" --build-arg "BASE=$base" -f infra/docker/kafka/Dockerfile "$ctx"
[ "$which" = kafka ] && exit 0

ctx=.docker/context/prometheus
rm -rf "$ctx" && mkdir -p "$ctx"
build surplus-prometheus:local --build-arg "BASE=$base" -f infra/docker/prometheus/Dockerfile "$ctx"

# The wheelhouse: every package the images install, as wheels, at the locked versions. The images
# run Debian bookworm's Python 3.11, so its compiled wheels must be cp311: made by the venv's pip
# where the venv is 3.11, else by a venv of python3.11 (PY311) in .docker/ made for it.
wheel_pip=$pip
if [ "$("$(dirname "$pip")/python" -c 'import sys; print(sys.version_info[:2] == (3, 11))')" != True ]; then
  py311=${PY311:-python3.11}
  "$py311" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null || {
    echo "missing prerequisite: the images' wheels are built for Debian bookworm's Python 3.11," \
         "and $pip is not 3.11's: put python3.11 on the PATH or name it with PY311=" >&2; exit 1; }
  [ -x .docker/wheel-venv-3.11/bin/pip ] || "$py311" -m venv .docker/wheel-venv-3.11
  wheel_pip=.docker/wheel-venv-3.11/bin/pip
  "$wheel_pip" install -q --upgrade pip
fi
wheels=$cache/wheels
wheels_key=$(cat requirements.lock pyproject.toml infra/docker/requirements.py | sha256sum | cut -c1-12)
if [ ! -f "$wheels/.lock-$wheels_key" ]; then
  echo "wheelhouse: $wheels"
  mkdir -p "$wheels"
  # shellcheck disable=SC2046
  "$wheel_pip" wheel -q -w "$wheels" -c requirements.lock setuptools setuptools-scm wheel \
    $(python3 infra/docker/requirements.py pyproject.toml client control report worker)
  rm -f "$wheels"/.lock-*; touch "$wheels/.lock-$wheels_key"
fi
# A fixed port: the build cache keys RUN steps by the build arguments, PIP_FIND_LINKS included.
port=${SURPLUS_WHEELS_PORT:-29480}
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "127.0.0.1:$port is taken: the wheelhouse is served on another port (no build cache)" >&2
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
python3 -m http.server --bind 127.0.0.1 --directory "$wheels" "$port" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
args=(--build-arg "PIP_FIND_LINKS=http://127.0.0.1:$port/" --build-arg PIP_NO_INDEX=1
      --build-arg "BASE=$base" -f infra/docker/Dockerfile)

have "surplus-deps:$key" || build "surplus-deps:$key" "${args[@]}" --target deps .
have "surplus-worker-deps:$key" || build "surplus-worker-deps:$key" "${args[@]}" --target worker-deps .
if [ ! -s "$saved" ]; then
  rm -f "$cache"/images/deps-*.tar; mkdir -p "$cache/images"
  t0=$SECONDS
  docker save -o "$saved.tmp" "$base" "surplus-deps:$key" "surplus-worker-deps:$key" && mv "$saved.tmp" "$saved"
  echo "  saved the third-party layers to $saved in $((SECONDS - t0)) s"
fi
cache_from=(--cache-from "surplus-deps:$key" --cache-from "surplus-worker-deps:$key")
# The build context has no .git: the version setuptools-scm reads here goes in as an argument.
version=(--build-arg "SURPLUS_VERSION=$("$(dirname "$pip")/python" -m setuptools_scm)")
build surplus:local "${args[@]}" "${cache_from[@]}" "${version[@]}" --target app .
build surplus-worker:local "${args[@]}" "${cache_from[@]}" "${version[@]}" --target worker .
# Its torch pieces (Dockerfile stage worker-cuda-deps, 1.3 GB) are not in the saved cache.
if [ "$which" = cuda ]; then
  build surplus-worker-cuda:local "${args[@]}" "${cache_from[@]}" "${version[@]}" --target worker-cuda .
fi
