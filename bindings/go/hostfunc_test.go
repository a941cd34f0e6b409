package tether

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestHostFuncCalledFromKernel: a compiled kernel (C[i] = call_packed("go.affine", A[i], i)) calls a Go closure;
// the output equals the Python runtime's with a Python callable of the same formula, bit for bit.
func TestHostFuncCalledFromKernel(t *testing.T) {
	dir, cf := loadCases(t)
	c := cf.Cases[0]
	_, err := LoadModule(c.Module)
	var le *LoadError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), `needs host function "go.affine"`) {
		t.Fatalf("a module needing an unregistered function loaded: %v", err)
	}
	calls := 0
	affine := func(args ...Value) (Value, error) {
		calls++
		return args[0].(float64)*2.0 + float64(args[1].(int64)), nil
	}
	if err := RegisterFunc("go.affine", affine); err != nil {
		t.Fatal(err)
	}
	defer RemoveFunc("go.affine")
	if err := RegisterFunc("go.affine", affine); err == nil {
		t.Fatal("a name was registered twice")
	}
	m, err := LoadModule(c.Module)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := m.GetFunction(c.Func)
	args, tensors := buildArgs(t, dir, c)
	defer func() {
		for _, tt := range tensors {
			tt.Close()
		}
	}()
	if err := f.Call(args...); err != nil {
		t.Fatal(err)
	}
	want := readTensor(t, dir, c.Outputs["1"])
	defer want.Close()
	if !bytes.Equal(args[1].(*Tensor).Bytes(), want.Bytes()) || calls != want.Numel() {
		t.Fatalf("the kernel's output differs from the Python runtime's (%d calls)", calls)
	}
	RemoveFunc("go.affine")
	RegisterFunc("go.affine", func(args ...Value) (Value, error) {
		if args[1].(int64) == 77 {
			return nil, fmt.Errorf("boom at %d", args[1])
		}
		return args[0], nil
	})
	err = f.Call(args...)
	if err == nil || err.Error() != "go_affine: host function 'go.affine' failed: boom at 77" {
		t.Fatalf("a failing closure: %v", err)
	}
	RemoveFunc("go.affine")
	RegisterFunc("go.affine", func(args ...Value) (Value, error) { panic("no") })
	if err := f.Call(args...); err == nil || !strings.Contains(err.Error(), "panic: no") {
		t.Fatalf("a panicking closure: %v", err)
	}
}
