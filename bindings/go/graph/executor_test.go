package graph

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tether "github.com/tether-ml/tether/bindings/go"
	"github.com/tether-ml/tether/bindings/go/internal/gofixtures"
)

// Fixtures come from tests/test_go_graph.py: model folders exported by tether.build_graph, inputs, and the
// Python graph executor's outputs on them, in the folder TETHER_GO_FIXTURES names.

type tensorFile = gofixtures.TensorFile

type modelRecord struct {
	Name   string     `json:"name"`
	Folder string     `json:"folder"`
	Runs   []modelRun `json:"runs"`
}

type modelRun struct {
	Inputs  map[string]tensorFile `json:"inputs"`
	Outputs []tensorFile          `json:"outputs"`
	Skipped []string              `json:"skipped"` // the nodes Python's profile skipped (tests/test_go_when.py)
}

// checkRun sets the run's inputs, runs, and compares every output with Python's bit for bit.
func checkRun(t *testing.T, dir string, e *Executor, name string, r int, run modelRun) {
	for in, tf := range run.Inputs {
		x := readTensor(t, dir, tf)
		if err := e.SetInput(in, x); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		x.Close()
	}
	if err := e.Run(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if e.GetNumOutputs() != len(run.Outputs) {
		t.Fatalf("%s: %d outputs, Python has %d", name, e.GetNumOutputs(), len(run.Outputs))
	}
	for i, want := range run.Outputs {
		got, err := e.GetOutput(i)
		if err != nil {
			t.Fatal(err)
		}
		exp := readTensor(t, dir, want)
		if !bytes.Equal(got.Bytes(), exp.Bytes()) {
			t.Fatalf("%s run %d: output %d differs from the Python graph executor's", name, r, i)
		}
		got.Close()
		exp.Close()
	}
}

// checkModelRuns loads each model, repeats each of its runs (checkRun) and hands the executor, still holding the
// run's outputs and state, to then before the next run.
func checkModelRuns(t *testing.T, dir string, models []modelRecord,
	then func(e *Executor, m modelRecord, r int, run modelRun)) {
	for _, m := range models {
		e, err := Load(m.Folder)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		for r, run := range m.Runs {
			checkRun(t, dir, e, m.Name, r, run)
			then(e, m, r, run)
		}
		e.Close()
	}
}

// firstModelFile reads the file name of the first model's folder, and says which folder that is.
func firstModelFile(t *testing.T, models []modelRecord, name string) (string, []byte) {
	folder := models[0].Folder
	raw, err := os.ReadFile(filepath.Join(folder, name))
	if err != nil {
		t.Fatal(err)
	}
	return folder, raw
}

func fixtures(t *testing.T) (string, []modelRecord) {
	return fixturesAt(t, "models", "tests/test_go_graph.py")
}

// fixturesAt reads the model records under key of cases.json, which the pytest driver wrote.
func fixturesAt(t *testing.T, key, driver string) (string, []modelRecord) {
	dir := gofixtures.Dir(t, "run through pytest "+driver+", which exports the models")
	var cf map[string]json.RawMessage
	gofixtures.ReadJSON(t, dir, "cases.json", &cf)
	var models []modelRecord
	if raw, ok := cf[key]; ok {
		if err := json.Unmarshal(raw, &models); err != nil {
			t.Fatalf("cases.json %q: %v", key, err)
		}
	}
	if len(models) == 0 {
		t.Fatalf("no %q models in the fixtures", key)
	}
	return dir, models
}

func readTensor(t *testing.T, dir string, tf tensorFile) *tether.Tensor {
	return gofixtures.ReadTensor(t, dir, tf, tether.NewTensor)
}

func TestModelsMatchPython(t *testing.T) {
	dir, models := fixtures(t)
	checkModelRuns(t, dir, models, func(e *Executor, m modelRecord, r int, run modelRun) {
		t.Logf("%s run %d: equal to Python bit for bit", m.Name, r)
	})
}

func TestBenchmark(t *testing.T) {
	_, models := fixtures(t)
	for _, m := range models {
		e, err := Load(m.Folder)
		if err != nil {
			t.Fatal(err)
		}
		var seen []int
		o := tether.DefaultTimeOptions()
		o.Repeat = 4
		o.OnSample = func(i int, perCall time.Duration, number int) {
			if perCall <= 0 || number != 10 {
				t.Errorf("sample %d: %v per call over %d calls", i, perCall, number)
			}
			seen = append(seen, i)
		}
		res, err := e.Benchmark(o)
		e.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Samples) != 4 || res.Number != 10 || !(res.MinMs > 0 && res.MinMs <= res.MedianMs) {
			t.Fatalf("benchmark %+v", res)
		}
		if len(seen) != 4 || seen[3] != 3 {
			t.Fatalf("samples streamed: %v", seen)
		}
		t.Logf("%s: median %.3f ms per run over %d samples of 10 (%d threads)", m.Name, res.MedianMs, len(res.Samples),
			tether.NumThreads())
	}
}

func TestParams(t *testing.T) {
	_, models := fixtures(t)
	folder, raw := firstModelFile(t, models, "deploy.params")
	p, err := ParseParams(raw)
	if err != nil || len(p) == 0 {
		t.Fatalf("params: %v (%d tensors)", err, len(p))
	}
	for cut := 0; cut < len(raw); cut += 1 + len(raw)/97 {
		if _, err := ParseParams(raw[:cut]); err == nil {
			t.Fatalf("a params file cut at %d bytes was accepted", cut)
		}
	}
	bad := append([]byte(nil), raw...)
	bad[0] = 'X'
	if _, err := ParseParams(bad); err == nil || !strings.Contains(err.Error(), "magic") {
		t.Fatalf("wrong magic: %v", err)
	}
	e, err := Load(folder)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var one string
	for name := range p {
		one = name
		break
	}
	delete(p, one)
	if err := e.LoadParams(p); err == nil || !strings.Contains(err.Error(), one) {
		t.Fatalf("missing param %q: %v", one, err)
	}
	wrong, _ := tether.NewTensor([]int64{3}, "float32")
	defer wrong.Close()
	if err := e.SetInput(e.InputNames()[0], wrong); err == nil {
		t.Fatal("an input of the wrong shape was accepted")
	}
	if err := e.SetInput("nope", wrong); err == nil {
		t.Fatal("an unknown input was accepted")
	}
	if _, err := e.GetOutput(e.GetNumOutputs()); err == nil {
		t.Fatal("an output index out of range was accepted")
	}
}
