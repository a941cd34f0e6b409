#!/usr/bin/env bash
# Build libtether_bridge.so (tether_bridge.c, the JNI bridge of dev.tether.device.NativeBridge) offline, without
# the NDK or Gradle: clang + ld.lld from Debian, jni.h from the JDK, and stub libc/libdl/libpthread libraries
# generated here (the bridge includes no libc header and declares the few functions it calls).
#
#   android_app/bridge/build.sh [--out DIR] ABI...      ABI: x86_64 aarch64 (glibc Linux), arm64-v8a armeabi-v7a
#                                                       (Android, bionic); default: all four
# Output: DIR/ABI/libtether_bridge.so (DIR defaults to android_app/build/bridge). Every build is 16 KB-aligned
# (-z max-page-size=16384), position-independent with no text relocations (-z text), and NEEDs only the libc
# and libdl of its platform (plus libpthread.so.0 on glibc, which older glibc needs for pthread_create).
# A library newer than this script and its source is kept (build cache).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/../build/bridge"
ABIS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    x86_64|aarch64|arm64-v8a|armeabi-v7a) ABIS+=("$1"); shift ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#ABIS[@]} -gt 0 ] || ABIS=(x86_64 aarch64 arm64-v8a armeabi-v7a)

die() { echo "build.sh: $*" >&2; exit 1; }
command -v clang >/dev/null || die "clang not found: apt-get install clang lld"
command -v ld.lld >/dev/null || die "ld.lld not found: apt-get install lld"
JAVAC="$(command -v javac || true)"
[ -n "$JAVAC" ] || die "javac not found (the JNI headers come from the JDK): apt-get install default-jdk-headless"
JDK="$(dirname "$(dirname "$(readlink -f "$JAVAC")")")"
[ -f "$JDK/include/jni.h" ] || die "no jni.h under $JDK/include: install a full JDK (default-jdk-headless)"
RESOURCE="$(clang -print-resource-dir)"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$OUT/.work"
mkdir -p "$WORK/include"
: > "$WORK/include/stdio.h"   # jni.h includes <stdio.h> but uses nothing from it

# The stub libraries: the right sonames and symbol names, empty bodies; only linked against, never loaded.
cat > "$WORK/stub_dl.c" <<'C'
void *dlopen(const char *p, int f) { return 0; }
void *dlsym(void *l, const char *n) { return 0; }
int dlclose(void *l) { return 0; }
char *dlerror(void) { return 0; }
C
cat > "$WORK/stub_pthread.c" <<'C'
int pthread_create(void *t, const void *a, void *(*s)(void *), void *arg) { return 0; }
int pthread_join(unsigned long t, void **r) { return 0; }
C
cat > "$WORK/stub_c.c" <<'C'
int clock_gettime(int c, void *ts) { return 0; }
void *calloc(unsigned long n, unsigned long s) { return 0; }
void free(void *p) {}
int dup(int fd) { return 0; }
int dup2(int fd, int fd2) { return 0; }
int sigaction(int s, const void *a, void *o) { return 0; }
int raise(int s) { return 0; }
long write(int fd, const void *b, unsigned long n) { return 0; }
unsigned long pthread_self(void) { return 0; }
int getsockname(int fd, void *a, unsigned int *l) { return 0; }
int getpeername(int fd, void *a, unsigned int *l) { return 0; }
C

build_one() {
  local abi="$1" triple cflags libc libdl libpthread
  case "$abi" in
    x86_64) triple=x86_64-linux-gnu; cflags=""; libc=libc.so.6; libdl=libdl.so.2; libpthread=libpthread.so.0 ;;
    aarch64) triple=aarch64-linux-gnu; cflags=""; libc=libc.so.6; libdl=libdl.so.2; libpthread=libpthread.so.0 ;;
    arm64-v8a) triple=aarch64-linux-android21; cflags=""; libc=libc.so; libdl=libdl.so; libpthread="" ;;
    armeabi-v7a) triple=armv7a-linux-androideabi21; cflags="-mfloat-abi=softfp -mfpu=vfpv3-d16 -mthumb"
                 libc=libc.so; libdl=libdl.so; libpthread="" ;;
  esac
  local dir="$OUT/$abi" stubs="$WORK/$abi"
  local lib="$dir/libtether_bridge.so"
  if [ -f "$lib" ] && [ "$lib" -nt "$HERE/tether_bridge.c" ] && [ "$lib" -nt "$HERE/build.sh" ]; then
    echo "$lib (cached)"
    return
  fi
  mkdir -p "$dir" "$stubs"
  local cc=(clang --target="$triple" $cflags -fPIC -O2 -ffreestanding -nostdinc -isystem "$RESOURCE/include"
            -fno-stack-protector -Wall -Werror)
  local ld=(-nostdlib -shared -fuse-ld=lld -Wl,--hash-style=both -Wl,-z,max-page-size=16384 -Wl,-z,text
            -Wl,-z,noexecstack -Wl,--build-id=sha1)
  "${cc[@]}" "${ld[@]}" -Wl,-soname,"$libc" "$WORK/stub_c.c" -o "$stubs/$libc"
  "${cc[@]}" "${ld[@]}" -Wl,-soname,"$libdl" "$WORK/stub_dl.c" -o "$stubs/$libdl"
  local pthread_lib=("$stubs/$libc")
  if [ -n "$libpthread" ]; then
    "${cc[@]}" "${ld[@]}" -Wl,-soname,"$libpthread" "$WORK/stub_pthread.c" -o "$stubs/$libpthread"
    pthread_lib+=("$stubs/$libpthread")
  else  # bionic: pthreads live in libc
    cat "$WORK/stub_c.c" "$WORK/stub_pthread.c" > "$stubs/stub_c_all.c"
    "${cc[@]}" "${ld[@]}" -Wl,-soname,"$libc" "$stubs/stub_c_all.c" -o "$stubs/$libc"
  fi
  "${cc[@]}" -fvisibility=hidden "${ld[@]}" -Wl,--no-undefined -Wl,-soname,libtether_bridge.so \
    -I "$WORK/include" -I "$JDK/include" -I "$JDK/include/linux" \
    "$HERE/tether_bridge.c" -o "$lib.tmp" "${pthread_lib[@]}" "$stubs/$libdl"
  mv "$lib.tmp" "$lib"
  echo "$lib"
}

for abi in "${ABIS[@]}"; do
  build_one "$abi"
done
