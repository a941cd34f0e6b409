"""Runs inside the emulated aarch64 userland under the instruction-count plugin (scripts/bench_arm.py): load a
model with onnxruntime or LiteRT (their aarch64 wheels, on PYTHONPATH), set one input, run it RUNS times on one
thread, save the first output, exit. Standard library, numpy and the runtime only (shipped into the guest as is).

The counted window is marked for the plugin (its MARK_SYSCALL, made through ctypes): the runtimes' start-up does
not repeat exactly from process to process, so the count per inference is taken inside one process: mark, mark,
mark, EXTRA inferences, mark; the second and third marks' difference is what a mark itself costs, subtracted.

argv: RUNTIME MODEL INPUT WARM EXTRA OUTPUT
  RUNTIME  "ort" (onnxruntime, CPU execution provider: MLAS) or "litert" (ai-edge-litert; XNNPACK, its default)
  MODEL    the .onnx or .tflite file
  INPUT    the one input (.npy)
  WARM     inferences before the counted window; EXTRA: inferences in it
  OUTPUT   the first output after the last run is saved here (.npy)
"""
import ctypes
import gc
import os
import sys


MARK_SYSCALL = 0x74e7   # insn_count_plugin.c


def main(argv):
    runtime, model, input_path, warm, extra, output = argv
    import numpy as np

    x = np.load(input_path, allow_pickle=False)
    if runtime == "ort":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # One thread and no spinning pool: the counted instructions are one inference's work, not a waiting loop.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        feeds = {sess.get_inputs()[0].name: x}
        first = sess.get_outputs()[0].name

        def run():
            return sess.run([first], feeds)[0]
    elif runtime == "litert":
        from ai_edge_litert.interpreter import Interpreter

        it = Interpreter(model_path=model, num_threads=1)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        out_index = it.get_output_details()[0]["index"]

        def run():
            it.invoke()
            return it.get_tensor(out_index)
    else:
        raise SystemExit("_arm_runtime_guest: unknown runtime %r (expected ort or litert)" % runtime)
    # as tether's guest program does: no cyclic collection lands among the counted inferences
    gc.collect()
    gc.disable()
    syscall = ctypes.CDLL(None).syscall
    out = None
    for _ in range(int(warm)):
        out = run()
    for _ in range(3):
        syscall(MARK_SYSCALL)
    for _ in range(int(extra)):
        out = run()
    syscall(MARK_SYSCALL)
    np.save(output, np.asarray(out), allow_pickle=False)
    sys.stdout.write("ok %s %s\n" % (out.dtype, list(out.shape)))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
