package tether

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// The fixtures come from tests/test_go_*.py (tests/fixtures/golang.py): modules, inputs and the outputs the
// Python runtime computed, in the folder TETHER_GO_FIXTURES names.

type tensorFile struct {
	File  string  `json:"file"`
	Shape []int64 `json:"shape"`
	DType string  `json:"dtype"`
}

type caseArg struct {
	Tensor *tensorFile `json:"tensor"`
	Int    *int64      `json:"int"`
	Float  *float64    `json:"float"`
	Str    *string     `json:"str"`
	Bytes  []int       `json:"bytes"`
}

type callCase struct {
	Name    string                `json:"name"`
	Module  string                `json:"module"`
	Func    string                `json:"func"`
	Args    []caseArg             `json:"args"`
	Threads int                   `json:"threads"`
	Outputs map[string]tensorFile `json:"outputs"`
}

type caseFile struct {
	Cases  []callCase        `json:"cases"`
	Errors map[string]string `json:"errors"`
}

func fixtureDir(t testing.TB) string {
	dir := os.Getenv("TETHER_GO_FIXTURES")
	if dir == "" {
		msg := "TETHER_GO_FIXTURES is not set: run these tests through pytest (tests/test_go_*.py), which builds the modules and expected outputs"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

func loadCases(t testing.TB) (string, *caseFile) {
	dir := fixtureDir(t)
	raw, err := os.ReadFile(filepath.Join(dir, "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cf caseFile
	if err := json.Unmarshal(raw, &cf); err != nil {
		t.Fatal(err)
	}
	return dir, &cf
}

func readTensor(t testing.TB, dir string, tf tensorFile) *Tensor {
	tt, err := NewTensor(tf.Shape, tf.DType)
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
