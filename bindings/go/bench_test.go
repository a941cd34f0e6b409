package tether

import (
	"os"
	"testing"
)

// BenchmarkPackedCall measures the cost of one packed call from Go: Function.Call (arguments converted on every
// call) and Bound.Run (converted once), on the module TETHER_GO_BENCH_MODULE names (function
// TETHER_GO_BENCH_FUNC, every argument a zero tensor of the shape its metadata gives).
// scripts/bench_go_calls.py runs it next to the Python runtime's calls on the same module.
func BenchmarkPackedCall(b *testing.B) {
	path, fname := os.Getenv("TETHER_GO_BENCH_MODULE"), os.Getenv("TETHER_GO_BENCH_FUNC")
	if path == "" || fname == "" {
		msg := "TETHER_GO_BENCH_MODULE / TETHER_GO_BENCH_FUNC are not set: run scripts/bench_go_calls.py"
		if os.Getenv("CI") != "" {
			b.Fatal(msg)
		}
		b.Skip(msg)
	}
	m, err := LoadModule(path)
	if err != nil {
		b.Fatal(err)
	}
	f, err := m.GetFunction(fname)
	if err != nil {
		b.Fatal(err)
	}
	var args []any
	for _, a := range f.Info().Args {
		t, err := NewTensor(a.Shape, a.DType)
		if err != nil {
			b.Fatal(err)
		}
		defer t.Close()
		args = append(args, t)
	}
	b.Run("Call", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := f.Call(args...); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Bound", func(b *testing.B) {
		bound, err := f.Bind(args...)
		if err != nil {
			b.Fatal(err)
		}
		defer bound.Close()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := bound.Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
