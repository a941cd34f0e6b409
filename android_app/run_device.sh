#!/usr/bin/env bash
# Run the Java device server (the classes the APK ships, android_app/device + protocol) in a desktop JVM:
#
#   android_app/run_device.sh [--host H] [--port P] [--token T] [--tracker HOST:PORT --key KEY [--reverse]]
#                             [--session-timeout S] [--idle-timeout S] [--workdir DIR] [--isolation process|thread]
#
# First use builds what it needs into android_app/build/ (javac --release 8 of the sources, and the JNI bridge
# for this machine with android_app/bridge/build.sh: x86_64 or aarch64, glibc); later runs reuse it while the
# sources are unchanged. Prints "listening on HOST:PORT" (and "registered" with a tracker) on stderr like
# rpc-server; stops on SIGTERM or Ctrl-C. Every session runs in a child JVM, so a crashing kernel ends only its
# session. Without --port the server takes a free port (rpc-server's default is 9090: pass --port 9090).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="${TETHER_DEVICE_BUILD:-$HERE/build}"
case "${1:-}" in -h|--help) sed -n '2,11p' "$0"; exit 0 ;; esac

die() { echo "run_device.sh: $*" >&2; exit 1; }
command -v java >/dev/null || die "java not found: apt-get install default-jdk-headless"

case "$(uname -m)" in
  x86_64|amd64) ABI=x86_64 ;;
  aarch64|arm64) ABI=aarch64 ;;
  *) die "no bridge build for $(uname -m) (x86_64 and aarch64 Linux only)" ;;
esac

CLASSES="$BUILD/device-classes"
STAMP="$CLASSES/.built"
mkdir -p "$BUILD"
if [ ! -f "$STAMP" ] || [ -n "$(find "$HERE/device/src" "$HERE/protocol/src" -name '*.java' -newer "$STAMP" | head -1)" ]; then
  command -v javac >/dev/null || die "javac not found: apt-get install default-jdk-headless"
  rm -rf "$CLASSES.tmp"
  mkdir -p "$CLASSES.tmp"
  javac --release 8 -Xlint:all,-options -encoding UTF-8 -d "$CLASSES.tmp" \
    $(find "$HERE/protocol/src" "$HERE/device/src" -name '*.java') >&2
  touch "$CLASSES.tmp/.built"
  rm -rf "$CLASSES"
  mv "$CLASSES.tmp" "$CLASSES"
fi

LIBDIR="${TETHER_BRIDGE_DIR:-$BUILD/bridge/$ABI}"
if [ ! -f "$LIBDIR/libtether_bridge.so" ] || [ "$HERE/bridge/tether_bridge.c" -nt "$LIBDIR/libtether_bridge.so" ]; then
  "$HERE/bridge/build.sh" --out "$BUILD/bridge" "$ABI" >&2
fi

exec java ${TETHER_DEVICE_JAVA_OPTS:-} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$CLASSES" \
  dev.tether.device.DeviceServer --native-lib-dir "$LIBDIR" "$@"
