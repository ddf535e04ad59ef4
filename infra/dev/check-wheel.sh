#!/usr/bin/env bash
# The wheel of this checkout installs into a clean virtualenv with each extra, at the versions
# requirements.lock pins, passes `pip check`, prints its version, and imports what the extra is
# for (`make test-wheel`, run by .ci/run). Usage: check-wheel.sh PYTHON [EXTRA...]
# (default: every extra). Each venv is removed once checked; worker and all hold torch (~6 GB).
# With UV set (the Makefile's), uv makes each venv (with pip, for `pip check`) and installs the
# wheel: it links torch from its cache where pip would unpack 6 GB again for each extra.
set -euo pipefail
py=${1:?python to build and install with}; shift
extras=("$@"); [ ${#extras[@]} -gt 0 ] || extras=(client worker control report all)
out=out/wheel
rm -rf "$out" && mkdir -p "$out"
# An isolated build, as a user's pip does it: setuptools-scm reads the version from git.
"$py" -m pip wheel -q --no-deps -w "$out/dist" .
wheel=$(ls "$out"/dist/surplus-*.whl)
echo "built $(basename "$wheel")"
imports() {
  case $1 in
  client)  echo "import workers.client.client" ;;
  worker)  echo "import torch, workers.runtime.server, workers.runtime.worker" ;;
  control) echo "import highspy, streams.app, streams.replay" ;;
  report)  echo "import matplotlib, streams.replay_report" ;;
  all)     echo "import torch, streams.app, surplus.demo.run, surplus.demo.report" ;;
  *) echo "check-wheel.sh: unknown extra $1" >&2; return 1 ;;
  esac
}
for extra in "${extras[@]}"; do
  code=$(imports "$extra")
  venv=$out/venv-$extra
  t0=$SECONDS
  if [ -n "${UV:-}" ]; then
    "$UV" venv -q --seed -p "$py" "$venv"
    "$UV" pip install -q --python "$venv/bin/python" -c requirements.lock "$wheel[$extra]"
  else
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q -c requirements.lock "$wheel[$extra]"
  fi
  "$venv/bin/pip" check >/dev/null || { "$venv/bin/pip" check; exit 1; }
  version=$("$venv/bin/surplus" --version)
  (cd "$out" && "$OLDPWD/$venv/bin/python" -c "$code")  # away from the source tree
  echo "surplus[$extra]: $version, $(du -sm "$venv" | cut -f1) MiB, imports ok ($((SECONDS - t0)) s)"
  rm -rf "$venv"
done
