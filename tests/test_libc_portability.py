"""A tether module needs no libc: the same .so loads and runs under a musl program, not only under glibc.

A small C program built with musl-gcc (dynamically linked against musl, whose loader is /lib/ld-musl-*.so.1)
dlopens the module, calls the packed function through the ABI header and prints the result, which is compared
with numpy. (bionic, Android's libc, has no runtime here; the emulated glibc boards cover ARM.)
"""
import pathlib
import subprocess

import numpy as np

import tether
from fixtures.prereq import require_tool
from fixtures.schedules import elementwise

LOADER = r"""
#include <dlfcn.h>
#include <stdio.h>
#include "tether_module.h"
int main(int argc, char** argv) {
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
  TetherPackedFunc f = (TetherPackedFunc)dlsym(lib, "vadd");
  if (!f) { fprintf(stderr, "dlsym: %s\n", dlerror()); return 3; }
  enum { N = 37 };
  float a[N], b[N], c[N];
  for (int i = 0; i < N; ++i) { a[i] = 0.5f * i; b[i] = 100.0f - i; }
  int64_t shape[1] = {N};
  DLTensor t[3] = {{a, {1, 0}, 1, {2, 32, 1}, shape, 0, 0}, {b, {1, 0}, 1, {2, 32, 1}, shape, 0, 0},
                   {c, {1, 0}, 1, {2, 32, 1}, shape, 0, 0}};
  TetherValue args[3] = {{.v_handle = &t[0]}, {.v_handle = &t[1]}, {.v_handle = &t[2]}};
  int32_t codes[3] = {TETHER_DLTENSOR, TETHER_DLTENSOR, TETHER_DLTENSOR};
  int32_t rc = f(args, codes, 3);
  if (rc) { fprintf(stderr, "vadd returned %d\n", rc); return 4; }
  for (int i = 0; i < N; ++i) printf("%.9g\n", c[i]);
  return 0;
}
"""


def test_module_loads_and_runs_under_musl(tmp_path: pathlib.Path):
    musl_gcc = require_tool("musl-gcc", "apt-get install musl-tools")
    n = 37
    s, args = elementwise(n, lambda a, b: a * b + a, factor=8, parallel=False)
    lib = tether.build(s, args, target="host", name="vadd")
    so = tmp_path / "vadd.so"
    lib.export_library(str(so))
    lib.export_header(str(tmp_path / "tether_module.h"))
    (tmp_path / "loader.c").write_text(LOADER)
    exe = tmp_path / "loader"
    subprocess.run([musl_gcc, "-O1", "-I", str(tmp_path), "-o", str(exe), str(tmp_path / "loader.c")],
                   check=True, capture_output=True, timeout=120)
    interp = subprocess.run(["readelf", "-l", str(exe)], capture_output=True, text=True).stdout
    assert "ld-musl" in interp, "the loader must run on musl's dynamic linker, not glibc's:\n" + interp
    out = subprocess.run([str(exe), str(so)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = np.array([float(x) for x in out.stdout.split()], dtype="float32")
    a = (0.5 * np.arange(n)).astype("float32")
    b = (100.0 - np.arange(n)).astype("float32")
    np.testing.assert_allclose(got, a * b + a, rtol=1e-6)
