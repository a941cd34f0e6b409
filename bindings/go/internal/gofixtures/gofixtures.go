// Package gofixtures reads the fixtures tests/test_go_*.py (tests/fixtures/golang.py) build for the Go tests:
// modules, inputs and the outputs Python computed, in the folder $TETHER_GO_FIXTURES names. Only tests use it.
package gofixtures

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TensorFile is a tensor stored as raw bytes in the fixtures folder.
type TensorFile struct {
	File  string  `json:"file"`
	Shape []int64 `json:"shape"`
	DType string  `json:"dtype"`
}

// Dir returns $TETHER_GO_FIXTURES. When it is unset the test is skipped, or failed under CI, where a skipped
// suite would pass unnoticed; hint says how to run the tests so that it is set.
func Dir(t testing.TB, hint string) string {
	t.Helper()
	dir := os.Getenv("TETHER_GO_FIXTURES")
	if dir == "" {
		msg := "TETHER_GO_FIXTURES is not set: " + hint
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// ReadJSON decodes the fixture file dir/name into v.
func ReadJSON(t testing.TB, dir, name string, v any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatal(err)
	}
}

// ReadTensor allocates a tensor of tf's shape and dtype with alloc and fills it from tf's file. alloc is
// tether.NewTensor, passed in because tether's own tests use this package and it cannot import tether.
func ReadTensor[T interface{ CopyFrom([]byte) error }](t testing.TB, dir string, tf TensorFile,
	alloc func(shape []int64, dtype string) (T, error)) T {
	t.Helper()
	tt, err := alloc(tf.Shape, tf.DType)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, tf.File))
	if err != nil {
		t.Fatal(err)
	}
	if err := tt.CopyFrom(raw); err != nil {
		t.Fatal(err)
	}
	return tt
}
