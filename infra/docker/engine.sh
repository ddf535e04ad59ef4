#!/usr/bin/env bash
# A Docker engine for the local image builds, testcontainers and compose runs.
#   engine.sh start DIR  -> prints the DOCKER_HOST to use. If one answers already ($DOCKER_HOST,
#                           else the default socket) that one is used and nothing is started;
#                           else dockerd (Debian's docker.io: infra/dev/system-package.sh installs
#                           it only with SURPLUS_INSTALL_SYSTEM_PACKAGES=1) starts with its
#                           data root in DIR, no iptables, no bridge (containers use host
#                           networking only) and overlay2 storage where the kernel mounts overlay
#                           on DIR's file system, else vfs ($SURPLUS_DOCKER_STORAGE chooses).
#                           vfs copies an image's whole file system for each container (twice:
#                           its init layer and its own), 10 GB for each worker.
#   engine.sh stop DIR   -> stops the dockerd that `start` started there (none: nothing to do).
set -euo pipefail
cmd=${1:?start|stop}
dir=$(mkdir -p "${2:?dir}" && cd "$2" && pwd)
sock=$dir/docker.sock
pidfile=$dir/dockerd.pid
case $cmd in
start)
  if [ -S "$sock" ] && DOCKER_HOST=unix://$sock docker version >/dev/null 2>&1; then
    echo "unix://$sock"; exit 0; fi
  if docker version >/dev/null 2>&1; then echo "${DOCKER_HOST:-unix:///var/run/docker.sock}"; exit 0; fi
  "$(dirname "$0")/../dev/system-package.sh" dockerd docker.io \
    "a Docker engine for the image builds, testcontainers and compose" >&2
  mkdir -p "$dir/data" "$dir/run"
  storage=${SURPLUS_DOCKER_STORAGE:-}
  if [ -z "$storage" ]; then
    probe=$(mktemp -d "$dir/overlay-probe.XXXXXX") && mkdir "$probe"/{lower,upper,work,merged}
    if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
        "$probe/merged" 2>/dev/null; then
      umount "$probe/merged"; storage=overlay2
    else storage=vfs; fi
    rm -rf "$probe"
  fi
  echo "dockerd: storage driver $storage, data root $dir/data" >&2
  nohup dockerd --host "unix://$sock" --data-root "$dir/data/$storage" --exec-root "$dir/run" \
    --pidfile "$pidfile" --storage-driver="$storage" --iptables=false --ip-masq=false --bridge=none \
    --log-level=warn >"$dir/dockerd.log" 2>&1 &
  for _ in $(seq 120); do
    if DOCKER_HOST=unix://$sock docker version >/dev/null 2>&1; then
      echo "$! started (log $dir/dockerd.log)" >"$dir/started"; echo "unix://$sock"; exit 0; fi
    kill -0 $! 2>/dev/null || break
    sleep 0.5
  done
  echo "dockerd did not start; its log:" >&2; tail -20 "$dir/dockerd.log" >&2; exit 1 ;;
stop)
  [ -f "$dir/started" ] && [ -f "$pidfile" ] || exit 0
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  # dockerd leaves its default network namespace mounted (run/netns/default): unmount what is
  # still mounted under DIR, so that the clone can be removed.
  awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount
  rm -f "$dir/started" ;;
*) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
