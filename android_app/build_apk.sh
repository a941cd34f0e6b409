#!/usr/bin/env bash
# Build the tether APK offline, without Gradle or the Android SDK:
#   aapt2 (manifest -> base APK)  javac (against android-23.jar)  dx (-> classes.dex)
#   bridge/build.sh (-> lib/arm64-v8a, lib/armeabi-v7a/libtether_bridge.so)  align_apk.py (16 KiB)  apksigner
#
#   android_app/build_apk.sh [--debs DIR] [--offline] [--out FILE] [--build-dir DIR]
#
# Tools: aapt2, zipalign and apksigner come from Debian 12 (`apt-get install aapt apksigner zipalign`), javac and
# keytool from a JDK (17 is fine), clang and ld.lld for the native bridge (`apt-get install clang lld`), python3. Debian 12 has neither an android.jar nor a dex compiler; they come from two
# Debian 11 packages, libandroid-23-java and dalvik-exchange, looked up in this order:
#   $ANDROID_JAR / $DX_JAR, /usr/share/java (if installed), android_app/.toolchain (a previous run),
#   --debs DIR (or $TETHER_ANDROID_DEBS) holding the two .deb files, and last `apt-get download` from bullseye
#   with a private apt state (network; skipped with --offline).
# The result is signed with a throw-away debug key (android_app/build/debug.keystore), fit for `adb install`,
# not for a store.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="$HERE/build"
CACHE="$HERE/.toolchain"
DEBS="${TETHER_ANDROID_DEBS:-}"
OFFLINE=0
OUT=""
MIN_SDK=21
TARGET_SDK=24  # Android 15 refuses to install a target below 24 (INSTALL_FAILED_DEPRECATED_SDK_VERSION)

while [ $# -gt 0 ]; do
  case "$1" in
    --debs) DEBS="$2"; shift 2 ;;
    --offline) OFFLINE=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "build_apk.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

OUT="${OUT:-$BUILD/tether-debug.apk}"
mkdir -p "$BUILD"
BUILD="$(cd "$BUILD" && pwd)"

die() { echo "build_apk.sh: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"; }

need aapt2 "apt-get install aapt"
need zipalign "apt-get install zipalign"
need apksigner "apt-get install apksigner"
need javac "install a JDK (openjdk-17-jdk-headless)"
need java "install a JDK (openjdk-17-jdk-headless)"
need keytool "install a JDK (openjdk-17-jdk-headless)"
need zip "apt-get install zip"
need dpkg "this script unpacks Debian packages with dpkg -x"
need python3 "apt-get install python3 (tools/align_apk.py aligns the native libraries)"
BRIDGE_BUILD="$HERE/bridge/build.sh"
# The APK without the native bridge would install and then fail at the first session: no bridge, no APK.
[ -f "$BRIDGE_BUILD" ] || die "$BRIDGE_BUILD is missing: the device server's native bridge cannot be built"

# -- android.jar and dx -----------------------------------------------------------------------------------------
find_jars() {
  ANDROID_JAR="${ANDROID_JAR:-}"
  DX_JAR="${DX_JAR:-}"
  for dir in /usr/share/java "$CACHE/usr/share/java"; do
    [ -z "$ANDROID_JAR" ] && [ -f "$dir/com.android.android-23.jar" ] && ANDROID_JAR="$dir/com.android.android-23.jar"
    if [ -z "$DX_JAR" ]; then
      for jar in "$dir"/com.android.dx.jar "$dir"/com.android.dx-*.jar; do
        [ -f "$jar" ] && DX_JAR="$jar" && break
      done
    fi
  done
  [ -n "$ANDROID_JAR" ] && [ -n "$DX_JAR" ]
}

unpack_debs() {  # $1: a folder with libandroid-23-java_*.deb and dalvik-exchange_*.deb
  local found=0
  for deb in "$1"/libandroid-23-java_*.deb "$1"/dalvik-exchange_*.deb; do
    [ -f "$deb" ] || continue
    dpkg -x "$deb" "$CACHE"
    found=$((found + 1))
  done
  [ "$found" -ge 2 ]
}

fetch_debs() {  # Debian 11's packages through a private apt state: the system's apt configuration is not touched
  local state="$CACHE/apt"
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/debs"
  echo "deb http://deb.debian.org/debian bullseye main" > "$state/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache" -o APT::Get::List-Cleanup=0
              -o APT::Sandbox::User=root)
  timeout 300 apt-get "${opts[@]}" -qq update
  (cd "$state/debs" && timeout 300 apt-get "${opts[@]}" -qq download libandroid-23-java dalvik-exchange)
  unpack_debs "$state/debs"
}

if ! find_jars; then
  mkdir -p "$CACHE"
  if [ -n "$DEBS" ]; then
    unpack_debs "$DEBS" || die "--debs $DEBS must hold libandroid-23-java_*.deb and dalvik-exchange_*.deb"
  elif [ "$OFFLINE" = 1 ]; then
    die "android-23.jar / dx not found and --offline given: pass --debs DIR (see docs/android.md)"
  else
    echo "fetching libandroid-23-java and dalvik-exchange from Debian 11 (bullseye) ..."
    fetch_debs || die "could not download the Debian 11 packages: pass --debs DIR (see docs/android.md)"
  fi
  find_jars || die "android-23.jar or dx.jar still missing after unpacking the packages into $CACHE"
fi
echo "android.jar: $ANDROID_JAR"
echo "dx:          $DX_JAR"

# -- build --------------------------------------------------------------------------------------------------------
rm -rf "$BUILD/classes" "$BUILD/dex" "$BUILD"/*.apk
mkdir -p "$BUILD/classes" "$BUILD/dex" "$(dirname "$OUT")"

# 1. resources (just the app name: the UI is built in code) and the manifest -> a base APK. The manifest uses one
#    attribute newer than android-23.jar (the service's foregroundServiceType, API 29): sdk-attrs/ declares it under
#    its real resource id in a resource-only "android" package, linked as a second framework include.
aapt2 compile --dir "$HERE/app/sdk-attrs/res" -o "$BUILD/sdk-attrs-res.zip"
aapt2 link -o "$BUILD/sdk-attrs.apk" --manifest "$HERE/app/sdk-attrs/AndroidManifest.xml" "$BUILD/sdk-attrs-res.zip"
aapt2 compile --dir "$HERE/app/res" -o "$BUILD/res.zip"
#    <uses-native-library> (API 31) is an element this aapt2 does not know: manifest validation is made a warning
#    and every warning but that one still fails the build.
aapt2 link -o "$BUILD/base.apk" -I "$ANDROID_JAR" -I "$BUILD/sdk-attrs.apk" \
  --manifest "$HERE/app/AndroidManifest.xml" "$BUILD/res.zip" --warn-manifest-validation \
  --min-sdk-version "$MIN_SDK" --target-sdk-version "$TARGET_SDK" --version-code 2 --version-name 0.2.0 \
  2> "$BUILD/aapt2-link.log" || { cat "$BUILD/aapt2-link.log" >&2; exit 1; }
if grep -v -e 'unexpected element <uses-native-library> found in <manifest><application>' \
     -e 'resources.arsc in APK .* is compressed' "$BUILD/aapt2-link.log" | grep -q .; then
  cat "$BUILD/aapt2-link.log" >&2
  die "aapt2 link: manifest warnings other than <uses-native-library> (above)"
fi

# 2. Java 8 bytecode against Android's own class library: any API Android 23 lacks fails here, not on the phone.
#    The protocol library, the device server (dev.tether.device) and the app.
find "$HERE/protocol/src" "$HERE/device/src" "$HERE/app/src" -name '*.java' > "$BUILD/sources.txt"
javac -nowarn -encoding UTF-8 -source 8 -target 8 -bootclasspath "$ANDROID_JAR" -Xlint:-options \
  -d "$BUILD/classes" @"$BUILD/sources.txt"

# 3. dex (dx takes Java 8 class files without lambdas; the library uses none)
java -jar "$DX_JAR" --dex --min-sdk-version="$MIN_SDK" --output="$BUILD/dex/classes.dex" "$BUILD/classes"

# 4. the native bridge for both Android ABIs, stored uncompressed under lib/<abi>/
rm -rf "$BUILD/lib"
bash "$BRIDGE_BUILD" --out "$BUILD/bridge" arm64-v8a armeabi-v7a
for abi in arm64-v8a armeabi-v7a; do
  [ -f "$BUILD/bridge/$abi/libtether_bridge.so" ] || die "bridge/build.sh made no $abi/libtether_bridge.so"
  mkdir -p "$BUILD/lib/$abi"
  cp "$BUILD/bridge/$abi/libtether_bridge.so" "$BUILD/lib/$abi/"
done

# 5. add the dex and the libraries, align (stored .so at 16 KiB: 16 KiB-page devices; the rest at 4 bytes), sign
#    with a debug key. Debian's zipalign has no -P 16, so tools/align_apk.py aligns and zipalign only checks.
cp "$BUILD/base.apk" "$BUILD/unaligned.apk"
(cd "$BUILD/dex" && zip -q -X "$BUILD/unaligned.apk" classes.dex)
(cd "$BUILD" && zip -q -X -0 "$BUILD/unaligned.apk" lib/arm64-v8a/libtether_bridge.so \
  lib/armeabi-v7a/libtether_bridge.so)
python3 "$HERE/tools/align_apk.py" "$BUILD/unaligned.apk" "$BUILD/aligned.apk"
zipalign -c -p 4 "$BUILD/aligned.apk" || die "zipalign -c -p 4 refuses the aligned APK"
KEYSTORE="$BUILD/debug.keystore"
if [ ! -f "$KEYSTORE" ]; then
  keytool -genkeypair -keystore "$KEYSTORE" -storepass android -keypass android -alias androiddebugkey \
    -keyalg RSA -keysize 2048 -validity 10000 -dname "CN=Android Debug,O=Android,C=US" -noprompt >/dev/null 2>&1
fi
apksigner sign --ks "$KEYSTORE" --ks-pass pass:android --key-pass pass:android --ks-key-alias androiddebugkey \
  --min-sdk-version "$MIN_SDK" --out "$OUT" "$BUILD/aligned.apk"
apksigner verify --min-sdk-version "$MIN_SDK" "$OUT"
python3 "$HERE/tools/align_apk.py" --check "$OUT" || die "signing moved the native libraries off 16 KiB"
rm -f "$BUILD/unaligned.apk" "$BUILD/aligned.apk" "$BUILD/base.apk" "$BUILD/res.zip" "$BUILD/sdk-attrs-res.zip"
echo "built $OUT ($(stat -c %s "$OUT") bytes)"
