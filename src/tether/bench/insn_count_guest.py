"""Runs inside an emulated ARM userland (Debian's python3 under qemu-user with the instruction-count plugin): load a
compiled model with the device package, set its inputs, run it RUNS times, exit. Standard library, numpy and the
device zipapp only (this file is shipped into the guest as is; it never imports ``tether``).

The inferences after the first WARM are a window marked for the plugin (its MARK_SYSCALL, made through ctypes):
mark, mark, mark, the rest of the RUNS, mark. The window counts what those inferences executed in this process
alone, less what a mark costs (the second and third marks' difference): the process's start-up and exit, which
move by tens of thousands of instructions between processes with different RUNS, stay outside it.

argv: BUNDLE FOLDER INPUTS_DIR RUNS WARM SYMBOLS RANGES OUTPUT
  BUNDLE      the device zipapp (tether_rpc), put on sys.path
  FOLDER      the model folder (deploy.json, deploy.so, deploy.params)
  INPUTS_DIR  input K of the graph in K.npy
  RUNS        inferences in all; WARM: those before the marked window (at most RUNS)
  SYMBOLS     "OFFSET SIZE NAME" lines (hex, relative to the library's load address): the library's functions
  RANGES      written here (atomically) as "START END NAME" guest addresses once the library is loaded and
              before it first runs, for the plugin's per-kernel attribution; "-" for none
  OUTPUT      the graph's first output after the last run is saved here (.npy); "-" for nowhere
"""
import ctypes
import gc
import os
import sys

MARK_SYSCALL = 0x74e7   # insn_count_plugin.c


def _load_base(lib_path):
    """Where the guest mapped ``lib_path``: the start of its file mapping at offset 0 (qemu emulates the guest's
    /proc/self/maps), found by inode so that no absolute path is resolved (whose length would shift later
    allocations)."""
    inode = os.stat(lib_path).st_ino
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 6 and int(parts[2], 16) == 0 and int(parts[4]) == inode:
                return int(parts[0].split("-")[0], 16)
    raise SystemExit("insn_count_guest: %s is not mapped" % lib_path)


def main(argv):
    bundle, folder, inputs_dir, runs, warm, symbols, ranges, output = argv
    runs, warm = int(runs), min(int(warm), int(runs))
    sys.path.insert(0, bundle)
    import json

    import numpy as np
    from tether_rpc import parallel
    from tether_rpc.graph_executor import GraphExecutor

    # One thread: loaded modules then run their parallel loops serially with no launcher (and no timing-based
    # choice between serial and pooled), and the plugin's counters see one guest CPU.
    parallel.set_num_threads(1)
    gm = GraphExecutor.from_folder(folder)
    for k, name in enumerate(gm.input_names):
        gm.set_input(name, np.load(os.path.join(inputs_dir, "%d.npy" % k), allow_pickle=False))
    if ranges != "-":
        with open(os.path.join(folder, "deploy.json"), "r", encoding="utf-8") as fh:
            lib = os.path.join(folder, json.load(fh).get("lib", "deploy.so"))
        base = _load_base(lib)
        lines = []
        with open(symbols) as fh:
            for line in fh:
                off, size, name = line.split()
                start = base + int(off, 16)
                lines.append("%x %x %s\n" % (start, start + int(size, 16), name))
        with open(ranges + ".part", "w") as fh:
            fh.writelines(lines)
        os.rename(ranges + ".part", ranges)
    # Python's cyclic collector runs after a count of allocations since start-up, so whether a collection (of
    # every object numpy and the executor made) lands among the counted inferences would depend on everything
    # before them, down to the length of a path. Off for the runs: an inference's count is the inference's.
    gc.collect()
    gc.disable()
    syscall = ctypes.CDLL(None).syscall
    for _ in range(warm):
        gm.run()
    for _ in range(3):
        syscall(MARK_SYSCALL)
    for _ in range(runs - warm):
        gm.run()
    syscall(MARK_SYSCALL)
    out = gm.get_output(0)
    if output != "-":
        np.save(output, out, allow_pickle=False)
    sys.stdout.write("ok %s %s %.9g\n" % (out.dtype, list(out.shape), float(np.asarray(out, np.float64).sum())))
    sys.stdout.flush()
    # No interpreter teardown: it would only add instructions that both runs then subtract again.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
