#!/usr/bin/env bash
# Test tools from Debian packages: libfaketime for the clock-offset system test (docs/design.md §10).
# Idempotent and quiet. Never fails the build: without apt (or without root, or offline) it says
# so in one line and the test that needs the tool skips with its own one-line reason.
set -uo pipefail
packages=(faketime libfaketime)
for library in /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1; do
  if [[ -f "$library" ]]; then exit 0; fi
done
if ! command -v apt-get >/dev/null 2>&1; then
  echo "note: apt-get not found; not installing ${packages[*]} (the clock-offset test will skip)"
  exit 0
fi
sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
  else
    echo "note: not root and no passwordless sudo; not installing ${packages[*]} (the clock-offset test will skip)"
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null 2>&1; then
  # The package lists may be missing or stale (a fresh container): refresh once, then retry.
  if ! { "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 &&
    "${sudo[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null 2>&1; }; then
    echo "note: apt-get could not install ${packages[*]} (the clock-offset test will skip)"
    exit 0
  fi
fi
echo "installed ${packages[*]} for the clock-offset test"
exit 0
