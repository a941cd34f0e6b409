"""Bad input on the command line: every command, given a wrong, empty, truncated or foreign-format file or folder,
or a bad option value, prints one line that names it, exits with status 2, shows no traceback and writes
nothing. Each case runs the real CLI in a subprocess, in an empty working folder that must stay empty (every
output path of a case is relative to it)."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from fixtures.digits import DIGITS, compile_digits

ROOT = pathlib.Path(__file__).resolve().parent.parent
TETHER = [sys.executable, "-m", "tether.cli.main"]
RPC_SERVER = [sys.executable, "-c",
              "import sys; sys.argv[0] = 'rpc-server'; from tether.cli.server import main; main()"]
RPC_TRACKER = [sys.executable, "-c",
               "import sys; sys.argv[0] = 'rpc-tracker'; from tether.cli.tracker import main; main()"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "rpc_server"), env.get("PYTHONPATH", "")])
    env.pop("TETHER_TOKEN", None)
    env.pop("TETHER_TRACKER_TOKEN", None)
    return env


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in pathlib.Path(folder).rglob("*"))


def run_cli(argv, cwd):
    return subprocess.run(argv, cwd=str(cwd), env=_env(), capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)


def assert_refused(argv, names, tmp_path):
    """``argv`` exits with status 2 and one stderr line naming each of ``names``, leaving its folder empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(parents=True)
    proc = run_cli(argv, cwd)
    err = proc.stderr.strip()
    assert proc.returncode == 2, "exit %d\nstdout: %s\nstderr: %s" % (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and err and len(err.splitlines()) == 1, proc.stderr
    for name in names:
        assert name in err, "%r not named in: %s" % (name, err)
    assert _tree(cwd) == [], "wrote %s" % _tree(cwd)
    return err


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """Input files and folders, each wrong in one way, by kind."""
    d = tmp_path_factory.mktemp("bad-input")
    data = pathlib.Path(DIGITS).read_bytes()
    files = {
        "empty": d / "empty.onnx",
        "truncated": d / "truncated.onnx",
        "random": d / "random.onnx",
        "tflite": d / "model.tflite",
        "json": d / "model.json",
        "keras": d / "model.keras",
        "not_python": d / "not_python.py",
        "not_elf": d / "not_elf.so",
        "digits": d / "digits.onnx",
    }
    files["empty"].write_bytes(b"")
    files["truncated"].write_bytes(data[:len(data) // 2])
    files["random"].write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    # a TFLite flatbuffer: root table offset, then the file identifier at bytes 4..8
    files["tflite"].write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(64))
    files["json"].write_text(json.dumps({"model": "not one", "layers": [1, 2]}))
    with zipfile.ZipFile(files["keras"], "w") as zf:
        zf.writestr("config.json", "{}")
        zf.writestr("metadata.json", "{}")
    files["not_python"].write_text("def kernels(:\n")
    files["not_elf"].write_text("not a library\n")
    files["digits"].write_bytes(data)
    saved = d / "saved_model"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"\x08\x01")
    files["saved_model"] = saved
    files["empty_dir"] = d / "empty_dir"
    files["empty_dir"].mkdir()
    np.save(d / "wrong_shape.npy", np.zeros(3, np.float32))
    files["wrong_shape"] = d / "wrong_shape.npy"

    good = d / "digits"
    compile_digits(good)
    files["model"] = good
    for name, damage in (("broken_json", lambda f: (f / "deploy.json").write_text('{"nodes": [')),
                         ("foreign_json", lambda f: (f / "deploy.json").write_text('{"a": 1}')),
                         ("truncated_params", lambda f: (f / "deploy.params").write_bytes(
                             (good / "deploy.params").read_bytes()[:100])),
                         ("no_library", lambda f: (f / "deploy.so").unlink()),
                         ("not_elf_library", lambda f: (f / "deploy.so").write_text("hello\n"))):
        shutil.copytree(good, d / name)
        damage(d / name)
        files[name] = d / name
    return {k: str(v) for k, v in files.items()}


COMPILE_CASES = [
    ("empty", ["empty.onnx", "empty"]),
    ("truncated", ["truncated.onnx", "not a valid ONNX model"]),
    ("random", ["random.onnx", "not a valid ONNX model"]),
    ("tflite", ["model.tflite", "not a valid TFLite model", "truncated or corrupt"]),
    ("json", ["model.json", "JSON"]),
    ("keras", ["model.keras", "Keras"]),
    ("saved_model", ["saved_model", "TensorFlow SavedModel"]),
    ("model", ["digits", "compiled tether model folder"]),
    ("empty_dir", ["empty_dir", "folder"]),
]




@pytest.mark.parametrize("args,names", [
    (["--target", "nosuch"], ["nosuch", "--target"]),
    (["--tuning-log", "{json}"], ["model.json", "not a tuning log"]),
    (["--tuning-log", "{random}"], ["random.onnx", "not a tuning log"]),
    (["--opt-level", "9"], ["--opt-level"]),
    (["--input-shape", "input:1,x"], ["input:1,x"]),
], ids=["target", "tuning-log-json", "tuning-log-binary", "opt-level", "input-shape"])
def test_compile_refuses_bad_options(bad, args, names, tmp_path):
    args = [a.format(**bad) for a in args]
    assert_refused(TETHER + ["compile", bad["digits"], "-o", "out"] + args, names, tmp_path)


def test_compile_check_and_a_missing_file(bad, tmp_path):
    assert_refused(TETHER + ["compile", bad["truncated"], "--check"], ["truncated.onnx"], tmp_path / "a")
    assert_refused(TETHER + ["compile", "missing.onnx"], ["missing.onnx"], tmp_path / "b")


RUN_CASES = [
    ("broken_json", ["broken_json", "deploy.json", "not valid JSON"]),
    ("foreign_json", ["foreign_json", "deploy.json", "not a tether graph JSON"]),
    ("truncated_params", ["truncated_params", "deploy.params"]),
    ("no_library", ["no_library", "deploy.so", "missing"]),
    ("not_elf_library", ["not_elf_library", "deploy.so", "not an ELF file"]),
    ("empty_dir", ["empty_dir", "deploy.json"]),
    ("tflite", ["model.tflite"]),
]


# compile: a file that is no ONNX model; run: a broken model folder
WRONG_FILE_CASES = ([(["compile", "{}", "-o", "out"], kind, names) for kind, names in COMPILE_CASES]
                    + [(["run", "{}", "--save-output", "y.npy"], kind, names) for kind, names in RUN_CASES])


@pytest.mark.parametrize("argv,kind,names", WRONG_FILE_CASES, ids=["%s-%s" % (a[0], k) for a, k, _ in WRONG_FILE_CASES])
def test_a_command_refuses_a_wrong_file(bad, argv, kind, names, tmp_path):
    assert_refused(TETHER + [a.format(bad[kind]) for a in argv], names, tmp_path)


@pytest.mark.parametrize("args,names", [
    (["--input", "{random}"], ["random.onnx", ".npy"]),
    (["--input", "{wrong_shape}"], ["wrong_shape.npy", "(4, 1, 8, 8)"]),
    (["--input", "nosuch={wrong_shape}"], ["nosuch", "input"]),
    (["--number", "many"], ["--number"]),
    (["--tracker", "nosuch", "--key", "k"], ["nosuch"]),
    (["--save-output", "missing/y.npy"], ["missing/y.npy", "--save-output"]),
], ids=["input-not-npy", "input-shape", "input-name", "number", "tracker", "save-output-folder"])
def test_run_refuses_bad_options(bad, args, names, tmp_path):
    args = [a.format(**bad) for a in args]
    assert_refused(TETHER + ["run", bad["model"], "--save-output", "y.npy"] + args, names, tmp_path)


@pytest.mark.parametrize("args,names", [
    (["{tflite}", "--local"], ["model.tflite", "TFLite"]),
    (["{truncated}", "--local"], ["truncated.onnx"]),
    (["{broken_json}", "--local"], ["deploy.json"]),
    (["{not_elf}:f", "--local"], ["not_elf.so", "ELF"]),
    (["{digits}", "--local", "--target", "nosuch"], ["nosuch"]),
    (["compare", "{json}", "{json}"], ["model.json", "not a tether bench document"]),
    (["compare", "{random}", "{random}"], ["random.onnx"]),
    (["compare", "{json}", "{json}", "--pair", "nope"], ["nope", "--pair"]),
    (["{digits}", "--local", "--csv", "missing/out.csv"], ["missing/out.csv", "--csv"]),
], ids=["tflite", "truncated-onnx", "broken-folder", "not-elf", "target", "compare-json", "compare-binary",
        "compare-pair", "csv-folder"])
def test_bench_refuses_bad_input(bad, args, names, tmp_path):
    args = [a.format(**bad) for a in args]
    assert_refused(TETHER + ["bench"] + args + ["--json", "out.json"], names, tmp_path)


@pytest.mark.parametrize("args,names", [
    (["{tflite}", "--tracker", "127.0.0.1:1", "--key", "k", "--log", "tune.jsonl"], ["model.tflite", "TFLite"]),
    (["{empty}", "--tracker", "127.0.0.1:1", "--key", "k", "--log", "tune.jsonl"], ["empty.onnx"]),
    (["{digits}", "--tracker", "127.0.0.1:1", "--key", "k", "--log", "tune.jsonl", "--target", "nosuch"],
     ["nosuch"]),
    # an existing file that is not a tuning log is never appended to
    (["{digits}", "--tracker", "127.0.0.1:1", "--key", "k", "--log", "{json}"], ["model.json", "not a tuning log"]),
    (["--log", "{json}", "--report", "report.html"], ["model.json", "not a tuning log"]),
    (["--log", "missing.jsonl", "--report", "report.html"], ["missing.jsonl"]),
    (["--log", "{json}", "--report", "missing/report.html"], ["missing/report.html", "--report"]),
], ids=["tflite", "empty", "target", "log-not-a-log", "report-not-a-log", "report-missing-log", "report-folder"])
def test_tune_refuses_bad_input(bad, args, names, tmp_path):
    before = pathlib.Path(bad["json"]).read_bytes()
    args = [a.format(**bad) for a in args]
    assert_refused(TETHER + ["tune"] + args, names, tmp_path)
    assert pathlib.Path(bad["json"]).read_bytes() == before


@pytest.mark.parametrize("args,names", [
    (["{not_python}"], ["not_python.py", "not valid Python"]),
    (["{tflite}"], ["model.tflite"]),
    (["{not_python}:kernels", "--target", "nosuch"], ["nosuch"]),
    (["{not_python}", "--emit", "exe"], ["exe", "--emit"]),
], ids=["syntax", "binary", "target", "emit"])
def test_build_refuses_bad_input(bad, args, names, tmp_path):
    args = [a.format(**bad) for a in args]
    assert_refused(TETHER + ["build"] + args + ["-o", "out"], names, tmp_path)


@pytest.mark.parametrize("argv,names", [
    (TETHER + ["bundle", "-o", "missing/tether-rpc.pyz"], ["missing", "--output"]),
    (TETHER + ["quickstart", "--size", "0"], ["--size"]),
    (TETHER + ["targets", "--nosuch"], ["--nosuch"]),
    (TETHER + ["emulate", "--arch", "nosuch", "--cache-dir", "cache"], ["nosuch", "--arch"]),
    (TETHER + ["query", "--tracker", "nosuch"], ["nosuch"]),
    (TETHER + ["bootstrap", "--identity", "missing-key", "pi@nowhere.invalid"], ["missing-key"]),
    (TETHER + ["nosuch-command"], ["nosuch-command"]),
    (TETHER + ["runtime", "--target", "nosuch", "-o", "rt"], ["nosuch", "--target"]),
    (TETHER + ["runtime", "-o", "missing/rt"], ["missing", "--output"]),
    (RPC_SERVER + ["--functions", "{not_python}", "--port", "0", "--workdir", "work"], ["not_python.py"]),
    (RPC_SERVER + ["--port", "99999"], ["--port"]),
    (RPC_TRACKER + ["--port", "0", "--ready-file", "missing/port"], ["missing/port"]),
    (RPC_TRACKER + ["--port", "99999"], ["--port"]),
], ids=["bundle", "quickstart", "targets", "emulate", "query", "bootstrap", "tether", "runtime-target",
        "runtime-output", "rpc-server-functions",
        "rpc-server-port", "rpc-tracker-ready-file", "rpc-tracker-port"])
def test_every_other_command_refuses_bad_input(bad, argv, names, tmp_path):
    argv = [a.format(**bad) for a in argv]
    assert_refused(argv, names, tmp_path)


def test_a_good_compile_still_works_in_the_same_way(bad, tmp_path):
    """The checks refuse what they should and pass the real thing: the digits CNN compiles and runs."""
    proc = run_cli(TETHER + ["compile", bad["digits"], "--input-shape", "input:1,1,8,8", "-o", "out"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["deploy.json", "deploy.params", "deploy.so"]
    proc = run_cli(TETHER + ["run", "out", "--number", "1", "--repeat", "1"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "output 0: float32 (1, 10)" in proc.stdout
