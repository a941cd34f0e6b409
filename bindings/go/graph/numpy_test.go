package graph

import (
	"strings"
	"testing"
)

// A version-3 graph with a numpy node (NonZero, Unique, ... in tether_rpc) is refused with an error naming the
// node and the op, before any storage or module is touched.
func TestRefusesNumpyNodes(t *testing.T) {
	js := `{"format": "tether-graph", "version": 3, "name": "g", "lib": "deploy.so", "storages": [16, 64],
		"entries": [{"name": "x", "shape": [4], "dtype": "float32", "storage": 0},
		            {"name": "y", "shape": [1, 4], "dtype": "int64", "storage": 1, "dynamic": true}],
		"inputs": [0], "outputs": [1], "params": [],
		"nodes": [{"name": "NonZero_0", "numpy": "nonzero", "attrs": {}, "inputs": [0], "outputs": [1]}]}`
	_, err := New([]byte(js), nil)
	if err == nil {
		t.Fatal("a graph with a numpy node was accepted")
	}
	for _, want := range []string{`"NonZero_0"`, `"nonzero"`, "tether_rpc"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}
