#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, runs `ruff check`, then pytest.
#   - system packages (as root, with apt): qemu-user and mmdebstrap for the emulated ARM devices,
#     openssh-server for the SSH bootstrap tests, musl-tools (a musl program loads a tether module), a JDK and aapt/zipalign/apksigner for the Android app's tests
#     (android-23.jar and dx are fetched once by android_app/build_apk.sh), chromium (headless, for the bench HTML report), golang-go (the Go bindings' tests), nodejs and npm (wasm32 modules; onnxruntime-web),
#     pocl-opencl-icd, ocl-icd-libopencl1, mesa-vulkan-drivers, libvulkan1 and spirv-tools (GPU modules on CPU drivers);
#   - Python packages: this project with its test extras (pip install -e '.[test]', ruff among them, and the
#     frontends' references: TensorFlow, LiteRT, Keras, OpenCV 4's dnn, coremltools);
#   - numpy 1.19.5 + msgpack 1.0.2 into a Python 3.9 (python3.9 on PATH or a pyenv 3.9.x; must exist): the oldest
#     device stack, which tests/test_tracker.py runs a device server under;
#   - mediapipe 0.10.14 (with numpy < 2) in a venv of its own under the cache: MediaPipe's runtime, the reference
#     for MediaPipe's custom ops LiteRT cannot run.
# Missing prerequisites that cannot be installed stop the run here with a message (never a silent skip).
# Extra arguments go to pytest, e.g.  scripts/test.sh -k protocol
# (without test selection, each GPU test file runs in a pytest process of its own: see the end of this file)
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap debian-archive-keyring)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v musl-gcc >/dev/null || missing+=(musl-tools)  # a musl program loads a tether .so
command -v javac >/dev/null || missing+=(default-jdk-headless)
command -v chromium >/dev/null || missing+=(chromium)  # tether bench --html is opened in headless Chromium
command -v node >/dev/null || missing+=(nodejs)  # wasm32 modules run in node through bindings/js
command -v npm >/dev/null || missing+=(npm)  # onnxruntime-web, the wasm benchmark's baseline, comes from npm
command -v go >/dev/null || missing+=(golang-go)  # bindings/go: tests/test_go_*.py run `go test` there
for tool in aapt2 zipalign apksigner zip; do  # the Android app is built offline in the suite
  command -v $tool >/dev/null || missing+=($([ $tool = aapt2 ] && echo aapt || echo $tool))
done
# The Java device server's JNI bridge (android_app/bridge/build.sh) is built offline with Debian's clang + ld.lld
command -v clang >/dev/null || missing+=(clang)
command -v ld.lld >/dev/null || missing+=(lld)
# GPU modules run on real drivers that need no GPU: pocl (OpenCL on the CPU) and Mesa's lavapipe (Vulkan on the
# CPU), through the loaders the device runtime opens with ctypes; spirv-val checks the SPIR-V tether emits
[ -e /etc/OpenCL/vendors/pocl.icd ] || missing+=(pocl-opencl-icd)
ldconfig -p | grep -q 'libOpenCL\.so\.1 ' || missing+=(ocl-icd-libopencl1)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
ldconfig -p | grep -q 'libvulkan\.so\.1 ' || missing+=(libvulkan1)
command -v spirv-val >/dev/null || missing+=(spirv-tools)
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

# The oldest supported device stack: a Python 3.9 (python3.9 on PATH or a pyenv 3.9.x) with numpy 1.19 and
# msgpack 1.0, which tests/test_tracker.py runs a device server under. Installed into that Python when missing.
old_device_python=""
for py in $(command -v python3.9 || true) ~/.pyenv/versions/3.9*/bin/python; do
  # a pyenv shim may exist without running: ask the interpreter itself
  if [ -x "$py" ] && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 9))' >/dev/null 2>&1; then
    old_device_python=$py; break
  fi
done
if [ -z "$old_device_python" ]; then
  echo "scripts/test.sh: no Python 3.9 found (the oldest supported device stack)" >&2
  echo "  install one with: pyenv install 3.9" >&2
  exit 1
fi
if ! "$old_device_python" -c 'import numpy, msgpack' >/dev/null 2>&1; then
  echo "scripts/test.sh: installing numpy 1.19.5 and msgpack 1.0.2 into $old_device_python" >&2
  "$old_device_python" -m pip install -q --disable-pip-version-check numpy==1.19.5 msgpack==1.0.2
fi

# The APK test also needs android-23.jar and dx, which Debian 12 lacks: build_apk.sh fetches them once from two
# Debian 11 packages into android_app/.toolchain (network), after which the suite builds the APK offline.
# CI has the two packages in ../shared/android-toolchain beside the checkout: use them, no network needed.
if [ -z "${TETHER_ANDROID_DEBS:-}" ] && ls ../shared/android-toolchain/dalvik-exchange_*.deb >/dev/null 2>&1; then
  export TETHER_ANDROID_DEBS="$(cd ../shared/android-toolchain && pwd)"
fi
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
# Real MediaPipe models (selfie segmentation with MediaPipe's transpose-conv custom op, hands, palms, pose, face
# mesh with attention) for tests/test_frontend_tflite_mediapipe.py: the .tflite files of the mediapipe 0.10.14
# wheel (later wheels ship none). The wheel is downloaded once, never installed, and only its models are kept.
mediapipe_models="${XDG_CACHE_HOME:-$HOME/.cache}/tether/mediapipe-0.10.14-models"
if [ ! -e "$mediapipe_models/.complete" ]; then
  echo "scripts/test.sh: fetching MediaPipe's models (the mediapipe 0.10.14 wheel's .tflite files)" >&2
  wheel_tmp=$(mktemp -d)
  if ! python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.11 --platform manylinux_2_17_x86_64 -d "$wheel_tmp" mediapipe==0.10.14; then
    echo "scripts/test.sh: could not download the mediapipe 0.10.14 wheel (its models are test data)" >&2
    exit 1
  fi
  mkdir -p "$mediapipe_models"
  python3 - "$wheel_tmp" "$mediapipe_models" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "mediapipe-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("mediapipe/modules/") and name.endswith(".tflite"):
            with open(os.path.join(sys.argv[2], os.path.basename(name)), "wb") as out:
                out.write(z.read(name))
PY
  touch "$mediapipe_models/.complete"
  rm -rf "$wheel_tmp"
fi
export TETHER_MEDIAPIPE_MODELS="$mediapipe_models"
# MediaPipe's own runtime, the reference for its custom ops that LiteRT cannot run (the face mesh with attention's):
# mediapipe 0.10.14 in a venv of its own, as it needs numpy < 2 and a protobuf of its own (this project's extras
# take others). tests/fixtures/mediapipe_runtime.py runs a model in it.
mediapipe_venv="${XDG_CACHE_HOME:-$HOME/.cache}/tether/mediapipe-0.10.14-venv"
if [ ! -e "$mediapipe_venv/.complete" ]; then
  echo "scripts/test.sh: installing mediapipe 0.10.14 into $mediapipe_venv (MediaPipe's runtime, a test reference)" >&2
  rm -rf "$mediapipe_venv"
  if ! python3 -m venv "$mediapipe_venv" || ! "$mediapipe_venv/bin/python" -m pip install -q \
      --disable-pip-version-check mediapipe==0.10.14 'numpy<2'; then
    echo "scripts/test.sh: could not install mediapipe 0.10.14 into $mediapipe_venv (MediaPipe's runtime)" >&2
    exit 1
  fi
  touch "$mediapipe_venv/.complete"
fi
export TETHER_MEDIAPIPE_PYTHON="$mediapipe_venv/bin/python"
# The lint check (configured in pyproject.toml) runs first: a finding stops the run before the long test suite
if ! python3 -m ruff check .; then
  echo "scripts/test.sh: ruff check found the problems above; fix them (see CONTRIBUTING.md)" >&2
  exit 1
fi
# The GPU tests load pocl and lavapipe (OpenCL and Vulkan on the CPU) into the pytest process. After several hundred
# of them, a later test in the same process once met a corrupted heap ("malloc(): unaligned tcache chunk detected";
# most likely a Vulkan instance destroyed under a running kernel, since fixed: docs/gpu.md "Testing"). A driver
# fault in one file must not take the rest of the suite down, so a whole run gives each GPU test file a process of
# its own. A run that names its own tests (paths, -k, ...) is left as it is.
gpu_files=(tests/test_gpu_*.py tests/test_java_gpu.py)
for arg in "$@"; do
  case "$arg" in
    -q|-v|-x|-s|-ra|-rA|--tb=*) ;;
    *) exec python3 -m pytest "$@" ;;
  esac
done
status=0
python3 -m pytest "$@" $(printf -- '--ignore=%s ' "${gpu_files[@]}") || status=$?
for f in "${gpu_files[@]}"; do
  python3 -m pytest "$@" "$f" || { rc=$?; [ "$status" -ne 0 ] || status=$rc; }
done
exit "$status"
