"""The Go graph executor honours the "when" guards of run-time If branches (bindings/go/graph/guards.go) as the
Python executor does: on models whose If condition is a run-time input, taking each branch, Go's outputs equal
Python's bit for bit and Go skips exactly the nodes Python's profile marks skipped; a malformed guard is refused
at load (bindings/go/graph/when_test.go)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP

from fixtures.golang import GoCases, compiled_model, run_go_test
from test_onnx_control_flow import X, if_model, vad_model, vi


def test_go_runs_only_the_taken_branch(tmp_path):
    nested = if_model([], nested=True)
    nested.graph.input.append(vi("c", (), TP.BOOL))
    vad, vad_feeds = vad_model(seed=4)
    runs_of = {"nested_if": [{"x": X, "c": np.array(v)} for v in (True, False)],
               "vad": [dict(vad_feeds, audio=vad_feeds["audio"] * g) for g in (2.0, 0.3)]}
    cases = GoCases(tmp_path / "cases")
    records = []
    for name, model in (("nested_if", nested), ("vad", vad)):
        folder = tmp_path / name
        gm = compiled_model(model, folder)
        runs, skipped_sets = [], []
        for feeds in runs_of[name]:
            for k, v in feeds.items():
                gm.set_input(k, v)
            nodes = gm.profile(number=1)["nodes"]
            skipped = [n["name"] for n in nodes if n.get("skipped")]
            skipped_sets.append(frozenset(skipped))
            runs.append(dict(cases.graph_run(gm, feeds), skipped=skipped))
        # the two runs take different branches, and skip something (a branch kernel fused with always-run
        # neighbours runs always, so one run may skip nothing)
        assert any(skipped_sets) and skipped_sets[0] != skipped_sets[1], (name, skipped_sets)
        records.append({"name": name, "folder": str(folder), "runs": runs})
    cases.write(guarded=records)
    names = ("TestWhenGuardsRunOnlyTheTakenBranch", "TestMalformedWhenIsRefusedAtLoad")
    out = run_go_test(["./graph"], tmp_path / "cases", run="^(%s)$" % "|".join(names))
    for name in names:
        assert "--- PASS: " + name in out, out
