package tether

import (
	"path/filepath"
	"testing"

	"github.com/tether-ml/tether/bindings/go/internal/gofixtures"
)

// dispatch.json (tests/test_cpu_dispatch_runtimes.py): CPU-features words the Python runtime computed
// (tether_rpc.cpu_features.dispatch_word) for lists of names on several CPUs, and modules with a word whose
// read_word(out) kernel reports what the runtime that loaded them wrote there.
type dispatchFixtures struct {
	Tables []struct {
		Name  string
		Names any
		Caps  struct {
			ISA      string   `json:"isa"`
			Features []string `json:"features"`
			Source   *string  `json:"source"`
		}
		Word uint32
	}
	Probes []struct {
		Module string
		Word   uint32
	}
}

func TestCPUDispatchWordMatchesPython(t *testing.T) {
	dir := fixtureDir(t)
	var fx dispatchFixtures
	gofixtures.ReadJSON(t, dir, "dispatch.json", &fx)
	if len(fx.Tables) == 0 || len(fx.Probes) == 0 {
		t.Fatal("no tables or probes in dispatch.json")
	}
	for _, c := range fx.Tables {
		caps := CPUCapabilities{ISA: c.Caps.ISA, Features: c.Caps.Features}
		if c.Caps.Source != nil {
			caps.Source = *c.Caps.Source
		}
		if got := dispatchWord(c.Names, caps); got != c.Word {
			t.Errorf("%s: names %v: go word %#x, python %#x", c.Name, c.Names, got, c.Word)
		}
	}
	for _, p := range fx.Probes {
		m, err := LoadModule(filepath.Join(dir, p.Module))
		if err != nil {
			t.Fatal(err)
		}
		if m.dispatchWord != p.Word {
			t.Errorf("%s: LoadModule set word %#x, python %#x", p.Module, m.dispatchWord, p.Word)
		}
		f, err := m.GetFunction("read_word")
		if err != nil {
			t.Fatal(err)
		}
		out, err := NewTensor([]int64{1}, "int64")
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Call(out); err != nil {
			t.Fatal(err)
		}
		if got := uint32(out.Int64s()[0]); got != p.Word {
			t.Errorf("%s: the module reads word %#x, python set %#x", p.Module, got, p.Word)
		}
		out.Close()
	}
}
