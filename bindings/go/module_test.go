package tether

import (
	"bytes"
	"errors"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-ml/tether/bindings/go/internal/gofixtures"
)

var modules = map[string]*Module{}

func load(t testing.TB, dir, name string) *Module {
	if m := modules[name]; m != nil {
		return m
	}
	m, err := LoadModule(filepath.Join(dir, name))
	if err != nil {
		t.Fatalf("LoadModule(%s): %v", name, err)
	}
	modules[name] = m
	return m
}

func TestLoadModuleListsFunctions(t *testing.T) {
	dir := fixtureDir(t)
	m := load(t, dir, "vadd.so")
	if got := m.FunctionNames(); !reflect.DeepEqual(got, []string{"vadd", "probe"}) {
		t.Fatalf("functions %v", got)
	}
	f, err := m.GetFunction("vadd")
	if err != nil {
		t.Fatal(err)
	}
	if a := f.Info().Args; len(a) != 3 || a[1].Name != "B" || a[1].DType != "float32" || a[1].Shape[0] != 1024 {
		t.Fatalf("arg info %+v", a)
	}
	if _, err := m.GetFunction("vmul"); err == nil {
		t.Fatal("an unknown function was found")
	}
}

func TestInspectRefusesForeignModules(t *testing.T) {
	dir := fixtureDir(t)
	_, err := LoadModule(filepath.Join(dir, "vadd_aarch64.so"))
	var le *LoadError
	if !errors.As(err, &le) || !le.ArchMismatch {
		t.Fatalf("an aarch64 module was not refused as an arch mismatch: %v", err)
	}
	_, err = LoadModule(filepath.Join(dir, "nometa.so"))
	if !errors.As(err, &le) || le.ArchMismatch || !bytes.Contains([]byte(err.Error()), []byte("not a tether module")) {
		t.Fatalf("a module without metadata: %v", err)
	}
	if _, err = LoadModule(filepath.Join(dir, "cases.json")); err == nil {
		t.Fatal("a JSON file loaded as a module")
	}
}

// TestRefusesGPUModule: a module whose metadata has a "device" entry (a GPU module) is refused in one line.
func TestRefusesGPUModule(t *testing.T) {
	dir := fixtureDir(t)
	_, err := LoadModule(filepath.Join(dir, "gpu_module.so"))
	var le *LoadError
	want := "tether: gpu_module.so: this device runs CPU modules only; gpu_module.so needs opencl, which is not available"
	if !errors.As(err, &le) || le.ArchMismatch || err.Error() != want {
		t.Fatalf("a GPU module was not refused as expected: %v", err)
	}
}

func buildArgs(t testing.TB, dir string, c callCase) ([]any, []*Tensor) {
	var args []any
	var tensors []*Tensor
	for _, a := range c.Args {
		switch {
		case a.Tensor != nil:
			tt := readTensor(t, dir, *a.Tensor)
			tensors = append(tensors, tt)
			args = append(args, tt)
		case a.Int != nil:
			args = append(args, *a.Int)
		case a.Float != nil:
			args = append(args, *a.Float)
		case a.Str != nil:
			args = append(args, *a.Str)
		case a.Bytes != nil:
			b := make([]byte, len(a.Bytes))
			for i, v := range a.Bytes {
				b[i] = byte(v)
			}
			args = append(args, b)
		default:
			t.Fatalf("case %s: unreadable argument %+v", c.Name, a)
		}
	}
	return args, tensors
}

// TestCasesMatchPython repeats every call Python made and compares the outputs bit for bit.
func TestCasesMatchPython(t *testing.T) {
	dir, cf := loadCases(t)
	defer SetNumThreads(DefaultNumThreads())
	for _, c := range cf.Cases {
		m := load(t, dir, c.Module)
		f, err := m.GetFunction(c.Func)
		if err != nil {
			t.Fatal(err)
		}
		if c.Threads > 0 {
			if err := SetNumThreads(c.Threads); err != nil {
				t.Fatal(err)
			}
		}
		args, tensors := buildArgs(t, dir, c)
		if err := f.Call(args...); err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
		for k, want := range c.Outputs {
			i, _ := strconv.Atoi(k)
			exp := readTensor(t, dir, want)
			if !bytes.Equal(args[i].(*Tensor).Bytes(), exp.Bytes()) {
				t.Fatalf("case %s: output %d differs from the Python runtime's", c.Name, i)
			}
			exp.Close()
		}
		for _, tt := range tensors {
			tt.Close()
		}
	}
}

func TestErrorsMatchPython(t *testing.T) {
	dir, cf := loadCases(t)
	vadd, _ := load(t, dir, "vadd.so").GetFunction("vadd")
	a, _ := NewTensor([]int64{1024}, "float32")
	b, _ := NewTensor([]int64{1000}, "float32")
	c, _ := NewTensor([]int64{1024}, "float32")
	c64, _ := NewTensor([]int64{1024}, "float64")
	defer func() { a.Close(); b.Close(); c.Close(); c64.Close() }()
	c.Float32s()[0] = 42
	full, _ := NewTensor([]int64{1024}, "float32")
	defer full.Close()
	check := func(key string, err error) {
		t.Helper()
		var ke *KernelError
		if !errors.As(err, &ke) {
			t.Fatalf("%s: want a KernelError, got %v", key, err)
		}
		if ke.Error() != cf.Errors[key] {
			t.Fatalf("%s: Go says %q, Python says %q", key, ke.Error(), cf.Errors[key])
		}
	}
	check("shape", vadd.Call(a, b, c))
	check("dtype", vadd.Call(a, full, c64))
	check("nargs", vadd.Call(a, full))
	// Python passes the int 3 as "int"; Go's int64 prints the same way in the message
	if err := vadd.Call(a, int64(3), c); err == nil {
		t.Fatal("an int was accepted as an array")
	} else if want := "vadd: argument 1 'B' must be an array, got int64"; err.Error() != want {
		t.Fatalf("got %q want %q", err.Error(), want)
	}
	if c.Float32s()[0] != 42 {
		t.Fatal("a refused call wrote its output")
	}
	par := load(t, dir, "par.so")
	fail, _ := par.GetFunction("fail")
	counts, _ := NewTensor([]int64{64}, "int32")
	defer counts.Close()
	check("task_failed", fail.Call(counts))
	if err := vadd.Call(a, struct{}{}, c); err == nil {
		t.Fatal("an unsupported Go type was accepted")
	}
}

// TestPoolRunsOnTwoOSThreads: par.c's mark kernel records each task's thread pointer; with wait_for_other
// task 0 spins until another task finished, so it can only finish if a second OS thread ran tasks.
func TestPoolRunsOnTwoOSThreads(t *testing.T) {
	dir := fixtureDir(t)
	load(t, dir, "ew.so") // a tether-built module: the pool provider
	mark, err := load(t, dir, "par.so").GetFunction("mark")
	if err != nil {
		t.Fatal(err)
	}
	defer SetNumThreads(DefaultNumThreads())
	counts, _ := NewTensor([]int64{64}, "int32")
	tids, _ := NewTensor([]int64{64}, "int64")
	defer counts.Close()
	defer tids.Close()
	run := func(wait int64) map[int64]bool {
		for i := range counts.Int32s() {
			counts.Int32s()[i] = 0
		}
		if err := mark.Call(counts, tids, wait); err != nil {
			t.Fatal(err)
		}
		seen := map[int64]bool{}
		for i, c := range counts.Int32s() {
			if c != 1 {
				t.Fatalf("task %d ran %d times", i, c)
			}
			seen[tids.Int64s()[i]] = true
		}
		return seen
	}
	for _, n := range []int{2, 4, 1, 3} {
		if err := SetNumThreads(n); err != nil {
			t.Fatal(err)
		}
		if PoolWorkers() != n-1 {
			t.Fatalf("%d threads: %d workers in the pool, want %d", n, PoolWorkers(), n-1)
		}
		if n == 1 {
			if seen := run(0); len(seen) != 1 {
				t.Fatalf("1 thread ran tasks on %d threads", len(seen))
			}
			continue
		}
		if seen := run(1); len(seen) < 2 {
			t.Fatalf("%d threads: tasks ran on %d thread(s)", n, len(seen))
		}
		for i := 0; i < 300; i++ { // back-to-back launches: each task id exactly once (checked in run)
			run(0)
		}
	}
}

func TestTensorViews(t *testing.T) {
	x, err := NewTensor([]int64{4, 8}, "float32")
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if uintptr(x.Pointer())%64 != 0 || x.NumBytes() != 128 || x.Numel() != 32 {
		t.Fatal("bad tensor layout")
	}
	v, err := x.View(64, []int64{16}, "float32")
	if err != nil {
		t.Fatal(err)
	}
	v.Float32s()[0] = 3
	if x.Float32s()[16] != 3 {
		t.Fatal("a view does not share memory")
	}
	v.Close()
	if _, err := x.View(4, []int64{32}, "float32"); err == nil {
		t.Fatal("a view past the end was allowed")
	}
	if _, err := x.View(2, []int64{1}, "float32"); err == nil {
		t.Fatal("a misaligned view was allowed")
	}
	if _, err := NewTensor([]int64{2}, "complex64"); err == nil {
		t.Fatal("an unknown dtype was accepted")
	}
}

// TestPoolProviderAfterCModule: a hand-written C module loaded before any pool-carrying module gets the
// launcher once the provider arrives (tests/test_go_runtime.py runs it alone in a fresh process).
func TestPoolProviderAfterCModule(t *testing.T) {
	dir := fixtureDir(t)
	mark, err := load(t, dir, "par.so").GetFunction("mark")
	if err != nil {
		t.Fatal(err)
	}
	defer SetNumThreads(DefaultNumThreads())
	if err := SetNumThreads(2); err != nil {
		t.Fatal(err)
	}
	load(t, dir, "ew.so")
	counts, _ := NewTensor([]int64{64}, "int32")
	tids, _ := NewTensor([]int64{64}, "int64")
	defer counts.Close()
	defer tids.Close()
	if err := mark.Call(counts, tids, int64(1)); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for _, id := range tids.Int64s() {
		seen[id] = true
	}
	if len(seen) < 2 {
		t.Fatalf("the C module loaded first ran its tasks on %d thread(s)", len(seen))
	}
}

// A module whose metadata "requires" names a CPU feature this CPU lacks is refused before dlopen, as an arch
// mismatch with the Python runtime's ArchMismatch text; one asking only for what the CPU has loads and runs.
func TestLoadRefusesMissingCPUFeatures(t *testing.T) {
	dir, cf := loadCases(t)
	want, ok := cf.Errors["arch_features"]
	if !ok {
		t.Skip("the fixtures have no module needing a missing CPU feature (they are made on x86_64 hosts)")
	}
	_, err := LoadModule(filepath.Join(dir, "needs_absent.so"))
	var le *LoadError
	if !errors.As(err, &le) || !le.ArchMismatch {
		t.Fatalf("a module needing a missing CPU feature was not refused as an arch mismatch: %v", err)
	}
	if got := le.Path + " " + le.Reason; got != want {
		t.Fatalf("message differs from the Python runtime's:\n go: %s\npy: %s", got, want)
	}
	if _, err := InspectModule(filepath.Join(dir, "needs_absent.so")); !errors.As(err, &le) || !le.ArchMismatch {
		t.Fatalf("InspectModule did not refuse it: %v", err)
	}
	f, err := load(t, dir, "needs_sse2.so").GetFunction("nop")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Call(); err != nil {
		t.Fatal(err)
	}
	if caps := ThisCPU(); caps.ISA != "x86_64" || caps.Source != "cpuinfo" || caps.SuggestedTarget != "host" {
		t.Fatalf("capabilities of this x86_64 CPU: %+v", caps)
	}
}

// cpufeatures.go agrees with tether_rpc.cpu_features (and device_info's cpuinfo parsing and board presets) on
// the CPUs qemu emulates, on ARM cpuinfo without an auxiliary vector and on x86_64.
func TestCPUFeaturesMatchPython(t *testing.T) {
	dir := fixtureDir(t)
	var cf struct {
		CPUTables []struct {
			Name, Arch, Cpuinfo, Platform, Preset, Target string
			Hwcap, Hwcap2                                 uint64
			Caps                                          struct {
				ISA      string   `json:"isa"`
				Features []string `json:"features"`
				Source   *string  `json:"source"`
			}
			Requires []any
			Missing  [][]string
		} `json:"cpu_tables"`
	}
	gofixtures.ReadJSON(t, dir, "cases.json", &cf)
	if len(cf.CPUTables) == 0 {
		t.Fatal("no cpu_tables in cases.json")
	}
	for _, c := range cf.CPUTables {
		info := parseCPUInfo(c.Cpuinfo)
		caps := capabilities(c.Arch, info, c.Hwcap, c.Hwcap2, c.Platform)
		src := ""
		if c.Caps.Source != nil {
			src = *c.Caps.Source
		}
		if caps.ISA != c.Caps.ISA || caps.Source != src || strings.Join(caps.Features, " ") != strings.Join(c.Caps.Features, " ") {
			t.Errorf("%s: go %+v, python %+v (source %q)", c.Name, caps, c.Caps, src)
		}
		for i, r := range c.Requires {
			if got := missingFeatures(r, caps); strings.Join(got, "|") != strings.Join(c.Missing[i], "|") {
				t.Errorf("%s: requires %v: go lacks %q, python %q", c.Name, r, got, c.Missing[i])
			}
		}
		if p := suggestPreset(c.Arch, caps, false); p != c.Preset {
			t.Errorf("%s: suggested preset go %q, python %q", c.Name, p, c.Preset)
		}
		if p := suggestTarget(c.Arch, info.cores, false); p != c.Target {
			t.Errorf("%s: suggested target go %q, python %q", c.Name, p, c.Target)
		}
	}
}
