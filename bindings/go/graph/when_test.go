package graph

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	tether "github.com/tether-ml/tether/bindings/go"
)

// Fixtures come from tests/test_go_when.py: models with an If on a run-time condition, inputs taking each
// branch, and the Python graph executor's outputs and skipped nodes (its profile) on them.

func guardedFixtures(t *testing.T) (string, []modelRecord) {
	return fixturesAt(t, "guarded", "tests/test_go_when.py")
}

// TestWhenGuardsRunOnlyTheTakenBranch: the same outputs as Python bit for bit, and the same nodes skipped.
func TestWhenGuardsRunOnlyTheTakenBranch(t *testing.T) {
	dir, models := guardedFixtures(t)
	checkModelRuns(t, dir, models, func(e *Executor, m modelRecord, r int, run modelRun) {
		skipped, want := append([]string{}, e.Skipped()...), append([]string{}, run.Skipped...)
		sort.Strings(skipped)
		sort.Strings(want)
		if len(skipped) != len(want) || (len(want) > 0 && !reflect.DeepEqual(skipped, want)) {
			t.Fatalf("%s run %d: Go skipped %v, Python %v", m.Name, r, skipped, want)
		}
		t.Logf("%s run %d: %d of %d nodes skipped, as in Python", m.Name, r, len(skipped), len(e.g.Nodes))
	})
}

// TestMalformedWhenIsRefusedAtLoad: every bad shape of a guard is an error naming the node, never a run.
func TestMalformedWhenIsRefusedAtLoad(t *testing.T) {
	_, models := guardedFixtures(t)
	folder, raw := firstModelFile(t, models, "deploy.json")
	mod, err := tether.LoadModule(filepath.Join(folder, "deploy.so"))
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"entry out of range": `[[999999, true]]`, "truth not a bool": `[[0, 1]]`, "not a pair": `[[0]]`,
		"not a list": `[7]`, "fractional entry": `[[0.5, true]]`,
	}
	for what, when := range bad {
		var g map[string]any
		if err := json.Unmarshal(raw, &g); err != nil {
			t.Fatal(err)
		}
		nodes := g["nodes"].([]any)
		var target map[string]any
		for _, n := range nodes {
			if nm := n.(map[string]any); nm["when"] != nil {
				target = nm
				break
			}
		}
		if target == nil {
			t.Fatal("no guarded node in the graph")
		}
		var w any
		if err := json.Unmarshal([]byte(when), &w); err != nil {
			t.Fatal(err)
		}
		target["when"] = w
		text, _ := json.Marshal(g)
		e, err := New(text, mod)
		if err == nil {
			e.Close()
			t.Fatalf("%s: a graph with \"when\": %s loaded", what, when)
		}
		if !strings.Contains(err.Error(), "when") || !strings.Contains(err.Error(), target["name"].(string)) {
			t.Fatalf("%s: the error does not name the guard and node: %v", what, err)
		}
	}
}
