// Package graph runs a compiled model folder (deploy.json + deploy.so + deploy.params, written by
// tether.build_graph) with the Go runtime: the same executor as rpc_server/tether_rpc/graph_executor.py.
//
// The graph JSON (docs/graph.md, versions 1 and 2) lists storages (byte sizes), entries (typed views of a
// storage at a byte offset: version 2), the input/output/param entries and the nodes (a packed function and its
// argument entries). Storages are 64-byte aligned C memory; at creation every node is bound once to DLTensor
// views of its entries, so Run is one cgo call per node. A node's "when" guards (the branches of an If on a
// run-time condition) are honoured as the Python executor honours them: the node runs only if every flag entry
// it names holds its truth value, so only the taken branch's kernels run (see guards.go).
package graph

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	tether "github.com/tether-ml/tether/bindings/go"
)

const graphFormat = "tether-graph"

var graphVersions = map[int]bool{1: true, 2: true}

type entryJSON struct {
	Name    string  `json:"name"`
	Shape   []int64 `json:"shape"`
	DType   string  `json:"dtype"`
	Storage int     `json:"storage"`
	Offset  int     `json:"offset"`
}

type nodeJSON struct {
	Name   string    `json:"name"`
	Func   string    `json:"func"`
	Args   []int     `json:"args"`
	Shapes [][]int64 `json:"shapes"`
	Numpy  string    `json:"numpy"` // version 3: an op the Python device runtime runs as numpy
	// [[flag entry, truth], ...]: the node runs only when every flag holds its truth (guards.go)
	When []json.RawMessage `json:"when"`
}

type graphJSON struct {
	Format   string      `json:"format"`
	Version  int         `json:"version"`
	Name     string      `json:"name"`
	Lib      string      `json:"lib"`
	Storages []int64     `json:"storages"`
	Entries  []entryJSON `json:"entries"`
	Inputs   []int       `json:"inputs"`
	Outputs  []int       `json:"outputs"`
	Params   []int       `json:"params"`
	Nodes    []nodeJSON  `json:"nodes"`
}

// Executor is a model ready to run: SetInput / Run / GetOutput, plus LoadParams and Benchmark.
// It is not safe for concurrent use (the storages are shared between runs).
type Executor struct {
	g        graphJSON
	module   *tether.Module
	storages []*tether.Tensor
	entries  []*tether.Tensor
	views    []*tether.Tensor // kernel views (rank-0 as (1,), node "shapes")
	calls    []*tether.Bound
	guards   [][]guard // per node: its "when" (none: it always runs)
	skipped  []bool    // per node: not run by the last Run (an untaken branch)
	inputs   map[string]int
	params   map[string]int
}

// Load reads deploy.json, the library it names (default deploy.so) and deploy.params (if present) in dir.
func Load(dir string) (*Executor, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "deploy.json"))
	if err != nil {
		return nil, fmt.Errorf("tether/graph: %w", err)
	}
	var probe struct {
		Lib string `json:"lib"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, fmt.Errorf("tether/graph: deploy.json is not valid JSON: %w", err)
	}
	lib := probe.Lib
	if lib == "" {
		lib = "deploy.so"
	}
	if filepath.Base(lib) != lib {
		return nil, fmt.Errorf("tether/graph: deploy.json names library %q outside its folder", lib)
	}
	mod, err := tether.LoadModule(filepath.Join(dir, lib))
	if err != nil {
		return nil, err
	}
	e, err := New(raw, mod)
	if err != nil {
		return nil, err
	}
	pp := filepath.Join(dir, "deploy.params")
	if _, err := os.Stat(pp); err == nil {
		if err := e.LoadParamsFile(pp); err != nil {
			e.Close()
			return nil, err
		}
	}
	return e, nil
}

// New builds an executor from graph JSON and a loaded module; load the params with LoadParams.
func New(graphJSONBytes []byte, mod *tether.Module) (*Executor, error) {
	e := &Executor{module: mod, inputs: map[string]int{}, params: map[string]int{}}
	if err := json.Unmarshal(graphJSONBytes, &e.g); err != nil {
		return nil, fmt.Errorf("tether/graph: graph JSON: %w", err)
	}
	g := &e.g
	if g.Format != graphFormat {
		return nil, fmt.Errorf("tether/graph: not a tether graph JSON (format %q)", g.Format)
	}
	for _, n := range g.Nodes {
		if n.Numpy != "" {
			// data-dependent shapes (NonZero, Unique, ...) run as numpy in tether_rpc only (docs/graph.md)
			return nil, fmt.Errorf("tether/graph: node %q runs numpy op %q (graph JSON version %d), which only the "+
				"Python device runtime (tether_rpc) implements; the Go runtime runs compiled kernels only", n.Name,
				n.Numpy, g.Version)
		}
	}
	if !graphVersions[g.Version] {
		return nil, fmt.Errorf("tether/graph: graph JSON version %d; this runtime reads versions 1, 2", g.Version)
	}
	if err := e.build(); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Executor) build() error {
	g := &e.g
	for i, n := range g.Storages {
		if n < 0 {
			return fmt.Errorf("tether/graph: storage %d has negative size %d", i, n)
		}
		t, err := tether.NewTensor([]int64{n}, "uint8")
		if err != nil {
			return err
		}
		e.storages = append(e.storages, t)
	}
	for k, en := range g.Entries {
		if en.Storage < 0 || en.Storage >= len(e.storages) {
			return fmt.Errorf("tether/graph: entry %d (%s) names storage %d of %d", k, en.Name, en.Storage, len(e.storages))
		}
		offset := en.Offset
		if g.Version == 1 {
			offset = 0 // version 1 has no offsets: every entry starts its storage
		}
		v, err := e.storages[en.Storage].View(offset, en.Shape, en.DType)
		if err != nil {
			return fmt.Errorf("tether/graph: entry %d (%s): %w", k, en.Name, err)
		}
		e.entries = append(e.entries, v)
	}
	checkIDs := func(what string, ids []int) error {
		for _, i := range ids {
			if i < 0 || i >= len(e.entries) {
				return fmt.Errorf("tether/graph: %s entry %d out of range (%d entries)", what, i, len(e.entries))
			}
		}
		return nil
	}
	for what, ids := range map[string][]int{"input": g.Inputs, "output": g.Outputs, "param": g.Params} {
		if err := checkIDs(what, ids); err != nil {
			return err
		}
	}
	for _, i := range g.Inputs {
		e.inputs[g.Entries[i].Name] = i
	}
	for _, i := range g.Params {
		e.params[g.Entries[i].Name] = i
	}
	for k, node := range g.Nodes {
		f, err := e.module.GetFunction(node.Func)
		if err != nil {
			return fmt.Errorf("tether/graph: node %d (%s): %w", k, node.Name, err)
		}
		if err := checkIDs("node "+node.Name, node.Args); err != nil {
			return err
		}
		if node.Shapes != nil && len(node.Shapes) != len(node.Args) {
			return fmt.Errorf("tether/graph: node %d (%s) has %d shapes for %d args", k, node.Name, len(node.Shapes), len(node.Args))
		}
		args := make([]any, len(node.Args))
		for j, id := range node.Args {
			ent := e.entries[id]
			shape := ent.Shape()
			if node.Shapes != nil { // same bytes, the kernel's view (e.g. an NCHW conv input as a matrix)
				shape = node.Shapes[j]
			} else if len(shape) == 0 { // kernels never take rank-0 tensors: a scalar travels as shape (1,)
				shape = []int64{1}
			}
			v, err := ent.View(0, shape, ent.DType())
			if err != nil {
				return fmt.Errorf("tether/graph: node %d (%s) argument %d: %w", k, node.Name, j, err)
			}
			if v.NumBytes() != ent.NumBytes() {
				v.Close()
				return fmt.Errorf("tether/graph: node %d (%s) argument %d: shape %v does not cover entry %v",
					k, node.Name, j, shape, ent.Shape())
			}
			e.views = append(e.views, v)
			args[j] = v
		}
		b, err := f.Bind(args...)
		if err != nil {
			return err
		}
		e.calls = append(e.calls, b)
		gs, err := e.parseGuards(k, node)
		if err != nil {
			return err
		}
		e.guards = append(e.guards, gs)
	}
	e.skipped = make([]bool, len(e.calls))
	return nil
}

// InputNames lists the model's inputs in order.
func (e *Executor) InputNames() []string {
	out := make([]string, len(e.g.Inputs))
	for i, id := range e.g.Inputs {
		out[i] = e.g.Entries[id].Name
	}
	return out
}

// OutputNames lists the model's outputs in order.
func (e *Executor) OutputNames() []string {
	out := make([]string, len(e.g.Outputs))
	for i, id := range e.g.Outputs {
		out[i] = e.g.Entries[id].Name
	}
	return out
}

// GetNumOutputs is the number of outputs.
func (e *Executor) GetNumOutputs() int { return len(e.g.Outputs) }

// GetNumInputs is the number of inputs.
func (e *Executor) GetNumInputs() int { return len(e.g.Inputs) }

// Input returns the buffer of input (or param) name: write into it (zero copy) instead of calling SetInput.
func (e *Executor) Input(name string) (*tether.Tensor, error) {
	if id, ok := e.inputs[name]; ok {
		return e.entries[id], nil
	}
	if id, ok := e.params[name]; ok {
		return e.entries[id], nil
	}
	return nil, fmt.Errorf("tether/graph: the model has no input %q (inputs: %v)", name, e.InputNames())
}

// SetInput copies x into input (or param) name; dtype and element count must match (a shape that differs only
// by dimensions of 1 is accepted, as in the Python executor).
func (e *Executor) SetInput(name string, x *tether.Tensor) error {
	dst, err := e.Input(name)
	if err != nil {
		return err
	}
	if x.DType() != dst.DType() || x.NumBytes() != dst.NumBytes() || !sameSqueezed(x.Shape(), dst.Shape()) {
		return fmt.Errorf("tether/graph: input %q: got %s%v, the model expects %s%v", name, x.DType(), x.Shape(), dst.DType(), dst.Shape())
	}
	copy(dst.Bytes(), x.Bytes())
	return nil
}

// SetInputIndex is SetInput by position.
func (e *Executor) SetInputIndex(i int, x *tether.Tensor) error {
	if i < 0 || i >= len(e.g.Inputs) {
		return fmt.Errorf("tether/graph: input index %d out of range: the model has %d input(s) %v", i, len(e.g.Inputs), e.InputNames())
	}
	return e.SetInput(e.g.Entries[e.g.Inputs[i]].Name, x)
}

func sameSqueezed(a, b []int64) bool {
	sq := func(s []int64) []int64 {
		var o []int64
		for _, d := range s {
			if d != 1 {
				o = append(o, d)
			}
		}
		return o
	}
	return equalShape(sq(a), sq(b))
}

// LoadParamsFile loads a deploy.params file.
func (e *Executor) LoadParamsFile(path string) error {
	p, err := ReadParamsFile(path)
	if err != nil {
		return err
	}
	return e.LoadParams(p)
}

// LoadParams copies every param the graph needs; a missing or mismatched one is an error naming it.
func (e *Executor) LoadParams(params map[string]Param) error {
	var missing []string
	for name := range e.params {
		if _, ok := params[name]; !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("tether/graph: params lack %d tensor(s) the graph needs: %v", len(missing), missing)
	}
	for name, id := range e.params {
		src, dst := params[name], e.entries[id]
		if src.DType != dst.DType() || !equalShape(src.Shape, dst.Shape()) {
			return fmt.Errorf("tether/graph: param %q is %s%v, the graph expects %s%v", name, src.DType, src.Shape, dst.DType(), dst.Shape())
		}
		copy(dst.Bytes(), src.Data)
	}
	return nil
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Run runs every node once, in order, except those whose "when" guards do not hold (Skipped lists them).
func (e *Executor) Run() error {
	for k, c := range e.calls {
		e.skipped[k] = !holds(e.guards[k])
		if e.skipped[k] {
			continue
		}
		if err := c.Run(); err != nil {
			return fmt.Errorf("tether/graph: node %d (%s): %w", k, e.g.Nodes[k].Name, err)
		}
	}
	return nil
}

// GetOutput returns a copy of output i (a new tensor the caller closes).
func (e *Executor) GetOutput(i int) (*tether.Tensor, error) {
	if i < 0 || i >= len(e.g.Outputs) {
		return nil, fmt.Errorf("tether/graph: output index %d out of range: the model has %d output(s)", i, len(e.g.Outputs))
	}
	src := e.entries[e.g.Outputs[i]]
	out, err := tether.NewTensor(src.Shape(), src.DType())
	if err != nil {
		return nil, err
	}
	copy(out.Bytes(), src.Bytes())
	return out, nil
}

// BenchmarkResult is the whole-model timing: samples in seconds per run.
type BenchmarkResult struct {
	tether.Timing
	MedianMs, MeanMs, MinMs float64
}

// Benchmark times whole runs like the Python executor's benchmark (time_evaluator over Run).
func (e *Executor) Benchmark(o tether.TimeOptions) (BenchmarkResult, error) {
	t, err := tether.TimeEvaluator(e.Run, o)
	if err != nil {
		return BenchmarkResult{}, err
	}
	return BenchmarkResult{Timing: t, MedianMs: t.Median() * 1e3, MeanMs: t.Mean() * 1e3, MinMs: t.Min() * 1e3}, nil
}

// Close releases the storages and bound calls (idempotent). The module stays loaded.
func (e *Executor) Close() {
	for _, c := range e.calls {
		c.Close()
	}
	for _, v := range e.views {
		v.Close()
	}
	for _, v := range e.entries {
		v.Close()
	}
	for _, s := range e.storages {
		s.Close()
	}
	e.calls, e.views, e.entries, e.storages = nil, nil, nil, nil
}
