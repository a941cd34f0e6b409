#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, then runs pytest.
#   - system packages (as root, with apt): qemu-user and mmdebstrap for the emulated ARM devices,
#     openssh-server for the SSH bootstrap tests, a JDK for the Android app's protocol tests;
#   - Python packages: this project with its test extras (pip install -e '.[test]').
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

python3 -m pip install -q --disable-pip-version-check -e '.[test]'
exec python3 -m pytest "$@"
