package rpc

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-ml/tether/bindings/go/internal/gofixtures"
)

// The shared protocol vectors (tests/vectors/frames.json, docs/protocol.md): every valid frame decodes to its
// meaning and its meaning encodes back to the same bytes; every invalid frame is refused with the named error.

// jsonValue reads one JSON value keeping object key order, with the vectors' special forms:
// {"$bin": hex}, {"$handle": id}, {"$tensor": {"dtype", "shape", "data": hex}}, {"$float": x}. Every float of a
// meaning is tagged $float: a bare JSON number with a fraction or exponent comes back as a bareFloat, which equals
// nothing, so an untagged float fails the vector.
func jsonValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			out := []any{}
			for dec.More() {
				v, err := jsonValue(dec)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := dec.Token()
			return out, err
		}
		m := NewMap()
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := jsonValue(dec)
			if err != nil {
				return nil, err
			}
			m.Set(k.(string), v)
		}
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		return special(m)
	case json.Number:
		s := t.String()
		if !strings.ContainsAny(s, ".eE") {
			if i, err := strconv.ParseInt(s, 10, 64); err == nil {
				return i, nil
			}
			u, err := strconv.ParseUint(s, 10, 64)
			return u, err
		}
		f, err := t.Float64()
		return bareFloat(f), err
	case string, bool, nil:
		return t, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}

// bareFloat is a JSON number written as a float outside {"$float": x}: the vectors never have one.
type bareFloat float64

func special(m *Map) (any, error) {
	if m.Len() != 1 {
		return m, nil
	}
	if v, ok := m.Get("$float"); ok {
		switch x := v.(type) {
		case bareFloat:
			return float64(x), nil
		case int64:
			return float64(x), nil
		}
		return nil, fmt.Errorf("$float holds %v, not a number", v)
	}
	if v, ok := m.Get("$bin"); ok {
		return hex.DecodeString(v.(string))
	}
	if v, ok := m.Get("$handle"); ok {
		return Handle(v.(int64)), nil
	}
	if v, ok := m.Get("$tensor"); ok {
		tm := v.(*Map)
		dt, _ := tm.Get("dtype")
		sh, _ := tm.Get("shape")
		data, _ := tm.Get("data")
		raw, err := hex.DecodeString(data.(string))
		if err != nil {
			return nil, err
		}
		shape := []int64{}
		for _, d := range sh.([]any) {
			shape = append(shape, d.(int64))
		}
		return &WireTensor{DType: dt.(string), Shape: shape, Data: raw}, nil
	}
	return m, nil
}

func readVectors(t *testing.T, path string) *Map {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := jsonValue(dec)
	if err != nil {
		t.Fatal(err)
	}
	return v.(*Map)
}

func valuesEqual(a, b any) bool {
	switch x := a.(type) {
	case *Map:
		y, ok := b.(*Map)
		if !ok || !reflect.DeepEqual(x.keys, y.keys) {
			return false
		}
		for _, k := range x.keys {
			if !valuesEqual(x.vals[k], y.vals[k]) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !valuesEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case float64:
		y, ok := b.(float64)
		return ok && (x == y || (math.IsNaN(x) && math.IsNaN(y)))
	}
	return reflect.DeepEqual(a, b)
}

func verdict(err error) string {
	var pe *ProtocolError
	var ft *FrameTooLarge
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrIncomplete):
		return "Incomplete"
	case errors.As(err, &ft):
		return "FrameTooLarge"
	case errors.As(err, &pe):
		return "ProtocolError"
	}
	return "other: " + err.Error()
}

func checkVectorFile(t *testing.T, path string, roundTrip bool) (checked int) {
	return checkVectors(readVectors(t, path), roundTrip, t.Errorf)
}

func checkVectors(doc *Map, roundTrip bool, report func(string, ...any)) (checked int) {
	valid, _ := doc.Get("valid")
	for _, item := range valid.([]any) {
		v := item.(*Map)
		name, _ := v.Get("name")
		h, _ := v.Get("hex")
		raw, _ := hex.DecodeString(h.(string))
		f, n, err := ParseFrame(raw, DefaultLimits)
		if err != nil || n != len(raw) {
			report("FAIL %s: %v (took %d of %d bytes)", name, err, n, len(raw))
			continue
		}
		if meaning, ok := v.Get("meaning"); ok && roundTrip {
			mm := meaning.(*Map)
			mt, _ := mm.Get("msg_type")
			rid, _ := mm.Get("request_id")
			pl, _ := mm.Get("payload")
			if int64(f.Type) != mt.(int64) || f.RequestID != rid.(int64) || !valuesEqual(f.Payload, pl) {
				report("FAIL %s: decoded %v %v %+v", name, f.Type, f.RequestID, f.Payload)
				continue
			}
			enc, err := EncodeFrame(int(mt.(int64)), rid.(int64), pl.(*Map))
			if err != nil || !bytes.Equal(enc, raw) {
				report("FAIL %s: encodes to %x, want %x (%v)", name, enc, raw, err)
				continue
			}
		}
		checked++
	}
	invalid, _ := doc.Get("invalid")
	for _, item := range invalid.([]any) {
		v := item.(*Map)
		name, _ := v.Get("name")
		h, _ := v.Get("hex")
		want, _ := v.Get("error")
		raw, _ := hex.DecodeString(h.(string))
		_, _, err := ParseFrame(raw, DefaultLimits)
		if got := verdict(err); got != want.(string) {
			report("FAIL %s: got %s, want %s", name, got, want)
			continue
		}
		checked++
	}
	return checked
}

func TestSharedVectors(t *testing.T) {
	path := filepath.Join("..", "..", "..", "tests", "vectors", "frames.json")
	n := checkVectorFile(t, path, true)
	doc := readVectors(t, path)
	types, _ := doc.Get("msg_types")
	want := map[string]int{"HELLO": MsgHello, "CHALLENGE": MsgChallenge, "AUTH": MsgAuth, "WELCOME": MsgWelcome,
		"CALL": MsgCall, "RETURN": MsgReturn, "ERROR": MsgError, "EVENT": MsgEvent, "CLOSE": MsgClose}
	for _, k := range types.(*Map).Keys() {
		v, _ := types.(*Map).Get(k)
		if int64(want[k]) != v.(int64) {
			t.Errorf("message type %s = %v, Go has %d", k, v, want[k])
		}
	}
	if pv, _ := doc.Get("protocol_version"); pv.(int64) != ProtocolVersion {
		t.Errorf("protocol version %v", pv)
	}
	t.Logf("%d vectors checked", n)
}

// TestEdgeVectors: frames at and just over every limit, with the Python implementation's verdicts
// (tests/test_go_rpc.py writes them to $TETHER_GO_FIXTURES/edges.json).
func TestEdgeVectors(t *testing.T) {
	dir := gofixtures.Dir(t, rpcFixturesHint)
	t.Logf("%d edge frames agree with Python", checkVectorFile(t, filepath.Join(dir, "edges.json"), false))
}

// TestVectorCheckNoticesBrokenVectors: a meaning that disagrees with its bytes, and a wrong verdict, both fail.
func TestVectorCheckNoticesBrokenVectors(t *testing.T) {
	doc := readVectors(t, filepath.Join("..", "..", "..", "tests", "vectors", "frames.json"))
	valid, _ := doc.Get("valid")
	meaning, _ := valid.([]any)[5].(*Map).Get("meaning")
	payload, _ := meaning.(*Map).Get("payload")
	payload.(*Map).Set("args", []any{int64(2)}) // the bytes still say 1
	invalid, _ := doc.Get("invalid")
	invalid.([]any)[0].(*Map).Set("error", "FrameTooLarge") // it is a ProtocolError
	var failures []string
	checkVectors(doc, true, func(f string, a ...any) { failures = append(failures, fmt.Sprintf(f, a...)) })
	if len(failures) != 2 {
		t.Fatalf("broken vectors reported: %v", failures)
	}
}
