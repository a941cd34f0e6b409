package graph

import (
	"encoding/json"
	"fmt"

	tether "github.com/tether-ml/tether/bindings/go"
)

// Run-time If branches (docs/graph.md, "Control flow"): a node of a branch carries "when":
// [[flag entry, true|false], ...] and runs only when every flag entry (one element, written by an earlier node)
// holds its truth value. The rules are the Python executor's (rpc_server/tether_rpc/graph_executor.py): a
// malformed item or a flag entry of more than one element is refused when the graph is loaded, and a flag is
// true when its element is nonzero.

type guard struct {
	flag  *tether.Tensor
	truth bool
}

func (e *Executor) parseGuards(k int, node nodeJSON) ([]guard, error) {
	var out []guard
	for _, raw := range node.When {
		var item []json.RawMessage
		var id int
		var truth bool
		if json.Unmarshal(raw, &item) != nil || len(item) != 2 || json.Unmarshal(item[0], &id) != nil ||
			json.Unmarshal(item[1], &truth) != nil || id < 0 || id >= len(e.entries) {
			return nil, fmt.Errorf("tether/graph: node %d (%s): malformed \"when\" item %s (expected [entry id, "+
				"true|false])", k, node.Name, string(raw))
		}
		flag := e.entries[id]
		if elems := elementCount(flag.Shape()); elems != 1 {
			return nil, fmt.Errorf("tether/graph: node %d (%s): \"when\" flag entry %d has %d elements (one "+
				"expected)", k, node.Name, id, elems)
		}
		out = append(out, guard{flag, truth})
	}
	return out, nil
}

func elementCount(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// isTrue is Python's bool() of a one-element entry: nonzero. For a float the sign bit alone (-0.0) is zero;
// a NaN is true.
func isTrue(t *tether.Tensor) bool {
	b := t.Bytes()
	float := false
	switch t.DType() {
	case "float16", "bfloat16", "float32", "float64":
		float = true
	}
	for i, v := range b {
		if float && i == len(b)-1 { // little-endian: the sign is the top bit of the last byte
			v &= 0x7f
		}
		if v != 0 {
			return true
		}
	}
	return false
}

func holds(gs []guard) bool {
	for _, g := range gs {
		if isTrue(g.flag) != g.truth {
			return false
		}
	}
	return true
}

// Skipped lists the nodes the last Run did not run (the kernels of untaken run-time If branches), by name.
func (e *Executor) Skipped() []string {
	var out []string
	for k, s := range e.skipped {
		if s {
			out = append(out, e.g.Nodes[k].Name)
		}
	}
	return out
}
