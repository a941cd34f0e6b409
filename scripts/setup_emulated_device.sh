#!/usr/bin/env bash
# Build the emulated ARM device userlands (Debian bookworm arm64/armhf with python3 + numpy + msgpack, run by
# qemu-user) that `tether emulate` and the emulated end-to-end tests use. Idempotent: a complete userland
# (stamp file present) is left alone unless --rebuild is given.
#
#   sudo scripts/setup_emulated_device.sh                      # both arches, into the invoking user's cache
#   sudo scripts/setup_emulated_device.sh --arch armv7 --cache-dir /var/cache/tether-userlands
#   scripts/setup_emulated_device.sh --list
#
# Needs root (mmdebstrap --mode=root), qemu-user and mmdebstrap. On Debian/Ubuntu, run as root, it installs
# them with apt-get; elsewhere it says what to install. The recipe itself (mmdebstrap, the libblas/liblapack
# links, byte-compiling, removing /tmp, the stamp) lives in src/tether/emulate.py, so the CLI, the tests and
# this script build identical userlands; this script only needs python3 >= 3.9, not an installed tether.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
orig_args=("$@")
arches=()
cache_dir=""
install=1
action=build
packages=base

usage() {
    sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<EOF
Options:
  --arch aarch64|armv7   build only this arch (repeatable; default: both)
  --cache-dir DIR        userland cache (default: \$TETHER_USERLAND_CACHE, \$XDG_CACHE_HOME/tether/userlands or
                         ~/.cache/tether/userlands of the user who ran sudo)
  --packages base|opencl the package set (default base; opencl adds pocl for OpenCL modules: a separate, larger
                         userland, see docs/emulation.md)
  --rebuild              rebuild even if a complete userland is cached
  --no-install           never apt-get install missing tools; fail with the list instead
  --list                 show the cached userlands and exit
  --clean                delete the cached userlands (the --arch ones, or all) and exit
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
        --arch) arches+=("$2"); shift 2 ;;
        --cache-dir) cache_dir="$2"; shift 2 ;;
        --packages) packages="$2"; shift 2 ;;
        --rebuild) action=rebuild; shift ;;
        --no-install) install=0; shift ;;
        --list) action=list; shift ;;
        --clean) action=clean; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
done
[ ${#arches[@]} -gt 0 ] || arches=(aarch64 armv7)

# Under sudo, cache for the user who asked, so their unprivileged test runs find the userlands.
if [ -z "$cache_dir" ] && [ -z "${TETHER_USERLAND_CACHE:-}" ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    cache_dir="$(getent passwd "$SUDO_USER" | cut -d: -f6)/.cache/tether/userlands"
fi
[ -z "$cache_dir" ] || export TETHER_USERLAND_CACHE="$cache_dir"

python=python3
command -v "$python" >/dev/null || { echo "error: python3 (>= 3.9) is needed to run the recipe" >&2; exit 1; }
run_recipe() {
    PYTHONPATH="$repo/src:$repo/rpc_server${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$@"
}

if [ "$action" = list ] || [ "$action" = clean ]; then
    run_recipe "$action" "${arches[@]}" <<'EOF'
import sys
from tether import emulate
action, arches = sys.argv[1], sys.argv[2:]
if action == "list":
    for row in emulate.list_userlands():
        print("%-8s %-10s %s" % (row["arch"], row["status"], row["path"]))
else:
    for arch in arches:
        for path in emulate.clean_userlands(arch):
            print("removed", path)
EOF
    exit 0
fi

missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
for arch in "${arches[@]}"; do
    case "$arch" in
        aarch64) q=qemu-aarch64 ;;
        armv7) q=qemu-arm ;;
        *) echo "error: unknown arch '$arch' (aarch64 or armv7)" >&2; exit 2 ;;
    esac
    command -v "$q" >/dev/null || command -v "$q-static" >/dev/null || missing+=("$q")
done

if [ ${#missing[@]} -gt 0 ]; then
    if [ "$install" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing qemu-user mmdebstrap (missing: ${missing[*]})" >&2
        # debian-archive-keyring lets mmdebstrap verify Debian's archive on Ubuntu and derivatives too.
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            qemu-user mmdebstrap debian-archive-keyring >/dev/null
    else
        cat >&2 <<EOF
error: missing ${missing[*]}. Install them (as root), then run this script again:
  Debian/Ubuntu:  apt-get install --no-install-recommends qemu-user mmdebstrap debian-archive-keyring
  Fedora:         dnf install qemu-user mmdebstrap debian-keyring
  Arch Linux:     pacman -S qemu-user mmdebstrap debian-archive-keyring
EOF
        exit 1
    fi
fi

if [ "$(id -u)" != 0 ]; then
    echo "error: building a userland needs root (mmdebstrap --mode=root): run 'sudo $0 ${orig_args[*]:-}'." >&2
    echo "       It is cached for the invoking user; later runs of tether emulate and the tests need no root." >&2
    exit 1
fi

TETHER_SETUP_PACKAGES="$packages" run_recipe "$action" "${arches[@]}" <<'EOF'
import os, sys, time
from tether import emulate
action, arches = sys.argv[1], sys.argv[2:]
for arch in arches:
    t0 = time.monotonic()
    userland = emulate.ensure_userland(arch, force=(action == "rebuild"),
                                       packages=os.environ["TETHER_SETUP_PACKAGES"],
                                       progress=lambda msg, a=arch: print("[%s] %s" % (a, msg), file=sys.stderr))
    s = userland.stamp
    print("%-8s ready in %.1f s: %s (Debian %s %s, python %s, numpy %s, msgpack %s, %.0f MB)"
          % (arch, time.monotonic() - t0, userland.path, s["suite"], s["debian_arch"], s["python_version"],
             s["numpy_version"], s["msgpack_version"], s["size_bytes"] / 1e6))
EOF

if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ] && [ -n "$cache_dir" ]; then
    # The user must be able to ship the device zipapp into /opt/tether (sticky, world-writable, like /tmp)
    # and to read everything; the stamp and lock files stay root's.
    chown "$SUDO_USER" "$cache_dir" 2>/dev/null || true
fi
