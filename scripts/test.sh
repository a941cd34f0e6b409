#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, then runs pytest.
#   - system packages (as root, with apt): qemu-user and mmdebstrap for the emulated ARM devices,
#     openssh-server for the SSH bootstrap tests, a JDK and aapt/zipalign/apksigner for the Android app's tests
#     (android-23.jar and dx are fetched once by android_app/build_apk.sh);
#   - Python packages: this project with its test extras (pip install -e '.[test]');
#   - checked, not installed: a Python 3.9 with numpy 1.19 and msgpack 1.0 (the oldest device stack; python3.9 on
#     PATH or a pyenv 3.9.x), which tests/test_tracker.py runs a device server under.
# Missing prerequisites that cannot be installed stop the run here with a message (never a silent skip).
# Extra arguments go to pytest, e.g.  scripts/test.sh -k protocol
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap debian-archive-keyring)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v javac >/dev/null || missing+=(default-jdk-headless)
for tool in aapt2 zipalign apksigner zip; do  # the Android app is built offline in the suite
  command -v $tool >/dev/null || missing+=($([ $tool = aapt2 ] && echo aapt || echo $tool))
done
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "scripts/test.sh: installing ${missing[*]} with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "scripts/test.sh: missing system packages: ${missing[*]}" >&2
    echo "  install them with: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

old_device_python=no
for py in $(command -v python3.9 || true) ~/.pyenv/versions/3.9*/bin/python; do
  if [ -x "$py" ] && "$py" -c 'import numpy, msgpack' >/dev/null 2>&1; then old_device_python=yes; break; fi
done
if [ $old_device_python = no ]; then
  echo "scripts/test.sh: no Python 3.9 with numpy and msgpack (the oldest supported device stack)" >&2
  echo "  install one with: pyenv install 3.9 && ~/.pyenv/versions/3.9*/bin/python -m pip install numpy==1.19.5 msgpack==1.0.2" >&2
  exit 1
fi

# The APK test also needs android-23.jar and dx, which Debian 12 lacks: build_apk.sh fetches them once from two
# Debian 11 packages into android_app/.toolchain (network), after which the suite builds the APK offline.
if [ -z "${TETHER_ANDROID_DEBS:-}" ] && [ ! -e /usr/share/java/com.android.android-23.jar ] \
    && [ ! -e android_app/.toolchain/usr/share/java/com.android.android-23.jar ]; then
  echo "scripts/test.sh: fetching the Android toolchain (android-23.jar, dx) with android_app/build_apk.sh" >&2
  apk_tmp=$(mktemp -d)
  if ! android_app/build_apk.sh --build-dir "$apk_tmp/build" --out "$apk_tmp/probe.apk" >"$apk_tmp/log" 2>&1; then
    cat "$apk_tmp/log" >&2
    echo "scripts/test.sh: android_app/build_apk.sh could not fetch the Android toolchain (see above)" >&2
    exit 1
  fi
  rm -rf "$apk_tmp"
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]'
exec python3 -m pytest "$@"
