#!/usr/bin/env bash
# A Debian package a make target needs, installed only when asked for:
#   system-package.sh COMMAND PACKAGE WHAT-FOR
# COMMAND on the PATH: nothing to do. Else, with SURPLUS_INSTALL_SYSTEM_PACKAGES=1 (as .ci/run
# sets, as root), apt-get installs PACKAGE; without it, one line says what to install and the
# target stops. Nothing is installed behind the user's back.
set -euo pipefail
cmd=${1:?command} package=${2:?package} why=${3:?what it is for}
command -v "$cmd" >/dev/null && exit 0
if [ "${SURPLUS_INSTALL_SYSTEM_PACKAGES:-}" = 1 ]; then
  echo "installing Debian's $package for $cmd ($why)" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "$package" >/dev/null
  exit 0
fi
echo "missing prerequisite: $cmd ($why): install Debian's $package (apt install $package)," \
     "or run with SURPLUS_INSTALL_SYSTEM_PACKAGES=1 as root to let make install it" >&2
exit 1
