package rpc

// msgpack for the tether wire format (docs/protocol.md): minimal-size encodings, str for text, bin for bytes,
// maps with string keys in insertion order, ext 1 (tensor) and ext 2 (remote handle); every length is checked
// against Limits before anything is allocated for it.

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"unicode/utf8"
)

const (
	extTensor = 1
	extHandle = 2
)

// Map is a msgpack map with string keys that keeps insertion order (the wire order).
type Map struct {
	keys []string
	vals map[string]any
}

// NewMap builds a map from alternating keys and values: NewMap("fn", "tether.echo", "args", []any{1}).
func NewMap(kv ...any) *Map {
	m := &Map{vals: map[string]any{}}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Set(kv[i].(string), kv[i+1])
	}
	return m
}

// Set adds or replaces key (a new key goes last).
func (m *Map) Set(k string, v any) {
	if m.vals == nil {
		m.vals = map[string]any{}
	}
	if _, ok := m.vals[k]; !ok {
		m.keys = append(m.keys, k)
	}
	m.vals[k] = v
}

// Get returns the value of k and whether it is present.
func (m *Map) Get(k string) (any, bool) {
	if m == nil {
		return nil, false
	}
	v, ok := m.vals[k]
	return v, ok
}

// Keys lists the keys in order.
func (m *Map) Keys() []string { return append([]string(nil), m.keys...) }

// Len is the number of entries.
func (m *Map) Len() int { return len(m.keys) }

// Handle is a remote object (array, module, function, graph) on the device: ext type 2.
type Handle uint64

// WireTensor is a tensor inside a frame: ext type 1 (little-endian elements, row-major).
type WireTensor struct {
	DType string
	Shape []int64
	Data  []byte
}

var wireItemSize = map[string]int{"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2,
	"bfloat16": 2, "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8}

// ---- encoding -------------------------------------------------------------------------------------------------

type encoder struct{ b []byte }

func (e *encoder) u8(v byte)    { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }
func (e *encoder) raw(p []byte) { e.b = append(e.b, p...) }

func (e *encoder) uint(v uint64) {
	switch {
	case v < 128:
		e.u8(byte(v))
	case v <= math.MaxUint8:
		e.u8(0xcc)
		e.u8(byte(v))
	case v <= math.MaxUint16:
		e.u8(0xcd)
		e.u16(uint16(v))
	case v <= math.MaxUint32:
		e.u8(0xce)
		e.u32(uint32(v))
	default:
		e.u8(0xcf)
		e.u64(v)
	}
}

func (e *encoder) int(v int64) {
	switch {
	case v >= 0:
		e.uint(uint64(v))
	case v >= -32:
		e.u8(byte(v))
	case v >= math.MinInt8:
		e.u8(0xd0)
		e.u8(byte(v))
	case v >= math.MinInt16:
		e.u8(0xd1)
		e.u16(uint16(v))
	case v >= math.MinInt32:
		e.u8(0xd2)
		e.u32(uint32(v))
	default:
		e.u8(0xd3)
		e.u64(uint64(v))
	}
}

func (e *encoder) lenHeader(n int, fix byte, fixMax int, c8, c16, c32 byte) {
	switch {
	case fix != 0 && n <= fixMax:
		e.u8(fix | byte(n))
	case c8 != 0 && n <= math.MaxUint8:
		e.u8(c8)
		e.u8(byte(n))
	case n <= math.MaxUint16:
		e.u8(c16)
		e.u16(uint16(n))
	default:
		e.u8(c32)
		e.u32(uint32(n))
	}
}

func (e *encoder) ext(code int8, data []byte) {
	switch len(data) {
	case 1:
		e.u8(0xd4)
	case 2:
		e.u8(0xd5)
	case 4:
		e.u8(0xd6)
	case 8:
		e.u8(0xd7)
	case 16:
		e.u8(0xd8)
	default:
		e.lenHeader(len(data), 0, 0, 0xc7, 0xc8, 0xc9)
	}
	e.u8(byte(code))
	e.raw(data)
}

func (e *encoder) value(v any) error {
	switch x := v.(type) {
	case nil:
		e.u8(0xc0)
	case bool:
		if x {
			e.u8(0xc3)
		} else {
			e.u8(0xc2)
		}
	case int:
		e.int(int64(x))
	case int32:
		e.int(int64(x))
	case int64:
		e.int(x)
	case uint64:
		e.uint(x)
	case uint32:
		e.uint(uint64(x))
	case float64:
		e.u8(0xcb)
		e.u64(math.Float64bits(x))
	case float32:
		e.u8(0xcb)
		e.u64(math.Float64bits(float64(x)))
	case string:
		e.lenHeader(len(x), 0xa0, 31, 0xd9, 0xda, 0xdb)
		e.raw([]byte(x))
	case []byte:
		e.lenHeader(len(x), 0, 0, 0xc4, 0xc5, 0xc6)
		e.raw(x)
	case []any:
		e.lenHeader(len(x), 0x90, 15, 0, 0xdc, 0xdd)
		for _, it := range x {
			if err := e.value(it); err != nil {
				return err
			}
		}
	case []string:
		e.lenHeader(len(x), 0x90, 15, 0, 0xdc, 0xdd)
		for _, it := range x {
			_ = e.value(it)
		}
	case []int64:
		e.lenHeader(len(x), 0x90, 15, 0, 0xdc, 0xdd)
		for _, it := range x {
			e.int(it)
		}
	case *Map:
		e.lenHeader(x.Len(), 0x80, 15, 0, 0xde, 0xdf)
		for _, k := range x.keys {
			_ = e.value(k)
			if err := e.value(x.vals[k]); err != nil {
				return err
			}
		}
	case map[string]any: // no order of its own: keys sorted, so the bytes are reproducible
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		m := &Map{}
		for _, k := range keys {
			m.Set(k, x[k])
		}
		return e.value(m)
	case Handle:
		var d [8]byte
		binary.BigEndian.PutUint64(d[:], uint64(x))
		e.ext(extHandle, d[:])
	case *WireTensor:
		size, ok := wireItemSize[x.DType]
		if !ok {
			return fmt.Errorf("tether/rpc: dtype %q cannot travel in a frame", x.DType)
		}
		n := int64(1)
		for _, d := range x.Shape {
			n *= d
		}
		if n*int64(size) != int64(len(x.Data)) {
			return fmt.Errorf("tether/rpc: tensor of shape %v %s needs %d bytes, has %d", x.Shape, x.DType, n*int64(size), len(x.Data))
		}
		d := []byte{byte(len(x.DType))}
		d = append(d, x.DType...)
		d = append(d, byte(len(x.Shape)))
		for _, s := range x.Shape {
			d = binary.BigEndian.AppendUint64(d, uint64(s))
		}
		e.ext(extTensor, append(d, x.Data...))
	default:
		return fmt.Errorf("tether/rpc: cannot send a %T (use numbers, strings, []byte, []any, *Map, Handle, *WireTensor)", v)
	}
	return nil
}

// Marshal encodes one value with minimal-size encodings.
func Marshal(v any) ([]byte, error) {
	e := &encoder{}
	if err := e.value(v); err != nil {
		return nil, err
	}
	return e.b, nil
}

// ---- decoding -------------------------------------------------------------------------------------------------

type decoder struct {
	b      []byte
	pos    int
	limits Limits
}

func (d *decoder) fail(format string, a ...any) error {
	return &ProtocolError{Msg: fmt.Sprintf(format, a...)}
}

func (d *decoder) need(n int) ([]byte, error) {
	if n < 0 || d.pos+n > len(d.b) {
		return nil, d.fail("truncated msgpack: needs %d more bytes at offset %d", n, d.pos)
	}
	p := d.b[d.pos : d.pos+n]
	d.pos += n
	return p, nil
}

func (d *decoder) uintN(n int) (uint64, error) {
	p, err := d.need(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	}
	return binary.BigEndian.Uint64(p), nil
}

func (d *decoder) value(depth int) (any, error) {
	p, err := d.need(1)
	if err != nil {
		return nil, err
	}
	c := p[0]
	switch {
	case c <= 0x7f:
		return int64(c), nil
	case c >= 0xe0:
		return int64(int8(c)), nil
	case c&0xf0 == 0x80:
		return d.mapN(int(c&0x0f), depth)
	case c&0xf0 == 0x90:
		return d.arrayN(int(c&0x0f), depth)
	case c&0xe0 == 0xa0:
		return d.str(int(c & 0x1f))
	}
	lenOf := func(n int) (int, error) {
		v, err := d.uintN(n)
		if err != nil {
			return 0, err
		}
		if v > math.MaxInt32 {
			return 0, d.fail("length %d is beyond any limit", v)
		}
		return int(v), nil
	}
	switch c {
	case 0xc0:
		return nil, nil
	case 0xc2:
		return false, nil
	case 0xc3:
		return true, nil
	case 0xcc, 0xcd, 0xce, 0xcf:
		v, err := d.uintN(1 << (c - 0xcc))
		if err != nil {
			return nil, err
		}
		if v > math.MaxInt64 {
			return v, nil
		}
		return int64(v), nil
	case 0xd0, 0xd1, 0xd2, 0xd3:
		n := 1 << (c - 0xd0)
		v, err := d.uintN(n)
		if err != nil {
			return nil, err
		}
		switch n {
		case 1:
			return int64(int8(v)), nil
		case 2:
			return int64(int16(v)), nil
		case 4:
			return int64(int32(v)), nil
		}
		return int64(v), nil
	case 0xca:
		v, err := d.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		v, err := d.uintN(8)
		return math.Float64frombits(v), err
	case 0xd9, 0xda, 0xdb:
		n, err := lenOf(1 << (c - 0xd9))
		if err != nil {
			return nil, err
		}
		return d.str(n)
	case 0xc4, 0xc5, 0xc6:
		n, err := lenOf(1 << (c - 0xc4))
		if err != nil {
			return nil, err
		}
		if n > d.limits.MaxBin {
			return nil, d.fail("bin of %d bytes exceeds the limit of %d", n, d.limits.MaxBin)
		}
		b, err := d.need(n)
		return append([]byte(nil), b...), err
	case 0xdc, 0xdd:
		n, err := lenOf(2 << (c - 0xdc))
		if err != nil {
			return nil, err
		}
		return d.arrayN(n, depth)
	case 0xde, 0xdf:
		n, err := lenOf(2 << (c - 0xde))
		if err != nil {
			return nil, err
		}
		return d.mapN(n, depth)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return d.ext(1 << (c - 0xd4))
	case 0xc7, 0xc8, 0xc9:
		n, err := lenOf(1 << (c - 0xc7))
		if err != nil {
			return nil, err
		}
		return d.ext(n)
	}
	return nil, d.fail("byte 0x%02x is not a msgpack type", c)
}

func (d *decoder) str(n int) (any, error) {
	if n > d.limits.MaxStr {
		return nil, d.fail("str of %d bytes exceeds the limit of %d", n, d.limits.MaxStr)
	}
	b, err := d.need(n)
	if err != nil {
		return nil, err
	}
	if !utf8.Valid(b) {
		return nil, d.fail("str is not valid UTF-8")
	}
	return string(b), nil
}

// depth: the level of the container being read (the frame's payload map is level 1, the body array level 0).
func (d *decoder) arrayN(n, depth int) (any, error) {
	if n > d.limits.MaxArray {
		return nil, d.fail("array of %d items exceeds the limit of %d", n, d.limits.MaxArray)
	}
	if depth > d.limits.MaxDepth {
		return nil, d.fail("frame nests deeper than %d levels", d.limits.MaxDepth)
	}
	if n > len(d.b)-d.pos { // each item takes at least one byte
		return nil, d.fail("truncated msgpack: array of %d items in %d bytes", n, len(d.b)-d.pos)
	}
	out := make([]any, n)
	for i := range out {
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (d *decoder) mapN(n, depth int) (any, error) {
	if n > d.limits.MaxMap {
		return nil, d.fail("map of %d entries exceeds the limit of %d", n, d.limits.MaxMap)
	}
	if depth > d.limits.MaxDepth {
		return nil, d.fail("frame nests deeper than %d levels", d.limits.MaxDepth)
	}
	if 2*n > len(d.b)-d.pos {
		return nil, d.fail("truncated msgpack: map of %d entries in %d bytes", n, len(d.b)-d.pos)
	}
	m := &Map{keys: make([]string, 0, n), vals: make(map[string]any, n)}
	for i := 0; i < n; i++ {
		k, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		ks, ok := k.(string)
		if !ok {
			return nil, d.fail("map keys must be strings, got %T", k)
		}
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		m.Set(ks, v)
	}
	return m, nil
}

func (d *decoder) ext(n int) (any, error) {
	if n > d.limits.MaxExt {
		return nil, d.fail("ext of %d bytes exceeds the limit of %d", n, d.limits.MaxExt)
	}
	p, err := d.need(1 + n)
	if err != nil {
		return nil, err
	}
	code, data := int8(p[0]), p[1:]
	switch code {
	case extHandle:
		if len(data) != 8 {
			return nil, d.fail("handle ext must carry 8 bytes, got %d", len(data))
		}
		return Handle(binary.BigEndian.Uint64(data)), nil
	case extTensor:
		return d.tensor(data)
	}
	return nil, d.fail("unknown msgpack ext type %d", code)
}

func (d *decoder) tensor(data []byte) (any, error) {
	if len(data) < 1 || len(data) < 2+int(data[0]) {
		return nil, d.fail("malformed tensor ext: truncated dtype")
	}
	name := string(data[1 : 1+data[0]])
	pos := 1 + int(data[0])
	ndim := int(data[pos])
	pos++
	size, ok := wireItemSize[name]
	if !ok {
		return nil, d.fail("tensor ext names dtype %q, which is not accepted", name)
	}
	if ndim > d.limits.MaxNDim {
		return nil, d.fail("tensor ext has %d dimensions (limit %d)", ndim, d.limits.MaxNDim)
	}
	if len(data) < pos+8*ndim {
		return nil, d.fail("malformed tensor ext: shape truncated")
	}
	shape := make([]int64, ndim)
	count := new(uint64)
	*count = 1
	overflow := false
	for i := range shape {
		v := binary.BigEndian.Uint64(data[pos+8*i:])
		shape[i] = int64(v)
		hi, lo := mul64(*count, v)
		if hi != 0 {
			overflow = true
		}
		*count = lo
	}
	pos += 8 * ndim
	rest := uint64(len(data) - pos)
	if *count == 0 {
		overflow = false // a zero extent makes the product 0 whatever the others are
	}
	if overflow || *count*uint64(size) != rest || (*count != 0 && rest/uint64(size) != *count) {
		return nil, d.fail("tensor ext of shape %v %s does not match its %d data bytes", shape, name, rest)
	}
	return &WireTensor{DType: name, Shape: shape, Data: append([]byte(nil), data[pos:]...)}, nil
}

func mul64(a, b uint64) (uint64, uint64) {
	if a == 0 || b == 0 {
		return 0, 0
	}
	lo := a * b
	if lo/b != a {
		return 1, lo
	}
	return 0, lo
}
