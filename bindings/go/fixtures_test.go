package tether

import (
	"testing"

	"github.com/tether-ml/tether/bindings/go/internal/gofixtures"
)

// The fixtures come from tests/test_go_*.py (tests/fixtures/golang.py): modules, inputs and the outputs the
// Python runtime computed, in the folder TETHER_GO_FIXTURES names.

type tensorFile = gofixtures.TensorFile

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
	return gofixtures.Dir(t, "run these tests through pytest (tests/test_go_*.py), which builds the modules and expected outputs")
}

func loadCases(t testing.TB) (string, *caseFile) {
	dir := fixtureDir(t)
	var cf caseFile
	gofixtures.ReadJSON(t, dir, "cases.json", &cf)
	return dir, &cf
}

func readTensor(t testing.TB, dir string, tf tensorFile) *Tensor {
	return gofixtures.ReadTensor(t, dir, tf, NewTensor)
}
