#!/usr/bin/env bash
# The base image every local image is built on: Debian bookworm (minbase, python3, venv,
# CA certificates) made with debootstrap from Debian's packages and loaded with `docker import`,
# since no registry can be pulled from here. The root filesystem's tarball is cached (default
# ~/.cache/surplus) so a fresh clone does not debootstrap again; without the cache it is made
# from nothing. Usage: base-image.sh IMAGE_TAG  (env: SURPLUS_IMAGE_CACHE, DEBIAN_MIRROR, DOCKER)
set -euo pipefail
tag=${1:?image tag}
docker=${DOCKER:-docker}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${SURPLUS_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/surplus}
include=python3,python3-venv,ca-certificates
tarball=$cache/rootfs-$suite-minbase-$(echo "$include v2" | sha256sum | cut -c1-12).tar
image_tar=${tarball%.tar}.image.tar  # the imported image, saved: loading it gives the same ID
if "$docker" image inspect "$tag" >/dev/null 2>&1; then exit 0; fi
if [ -s "$image_tar" ] && [ -s "$tarball" ]; then
  "$docker" load -q -i "$image_tar" >/dev/null && echo "$tag: loaded from $image_tar" && exit 0
fi
if [ ! -s "$tarball" ]; then
  "$(dirname "$0")/../dev/system-package.sh" debootstrap debootstrap \
    "the Debian root filesystem of the images' base"
  mkdir -p "$cache"
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  echo "debootstrap $suite (minbase + $include) from $mirror"
  debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; exit 1; }
  rm -f "$root.log"
  cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror $suite main
deb $mirror $suite-updates main
deb ${mirror%/debian}/debian-security $suite-security main
SOURCES
  # Slim: no apt lists, caches, docs or manuals in the layer (the directories stay: packages'
  # scripts link into them, openjdk's into man1).
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  find "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/locale -type f -delete
  tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
  rm -f "$cache"/rootfs-*.tar  # an older base's (and its saved image)
  mv "$tarball.tmp" "$tarball"
fi
"$docker" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$tarball" "$tag" >/dev/null
"$docker" save -o "$image_tar.tmp" "$tag" && mv "$image_tar.tmp" "$image_tar"
echo "$tag: imported from $tarball"
