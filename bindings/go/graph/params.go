package graph

import (
	"encoding/binary"
	"fmt"
	"os"

	tether "github.com/tether-ml/tether/bindings/go"
)

// The deploy.params format (docs/params.md): little-endian, a header then 64-byte aligned records.

var paramsMagic = []byte("TTHRPRM\x00")

const (
	paramsVersion = 1
	paramsAlign   = 64
	maxRank       = 32
)

// Param is one tensor of a params file; Data aliases the file's bytes.
type Param struct {
	Name  string
	Shape []int64
	DType string
	Data  []byte
}

// ReadParamsFile reads and checks a deploy.params file.
func ReadParamsFile(path string) (map[string]Param, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tether/graph: cannot read params: %w", err)
	}
	return ParseParams(raw)
}

// ParseParams parses a params file held in memory, refusing what docs/params.md says a reader must refuse.
func ParseParams(raw []byte) (map[string]Param, error) {
	pos := 0
	fail := func(format string, a ...any) (map[string]Param, error) {
		return nil, fmt.Errorf("tether/graph: params: "+format, a...)
	}
	need := func(n int) bool { return n >= 0 && pos+n <= len(raw) }
	if !need(16) {
		return fail("file of %d bytes is too short for the header (truncated)", len(raw))
	}
	if string(raw[:8]) != string(paramsMagic) {
		return fail("wrong magic %q: not a tether params file", raw[:8])
	}
	if v := binary.LittleEndian.Uint32(raw[8:]); v != paramsVersion {
		return fail("version %d; this reader reads version %d", v, paramsVersion)
	}
	count := int(binary.LittleEndian.Uint32(raw[12:]))
	pos = 16
	out := map[string]Param{}
	for k := 0; k < count; k++ {
		if !need(2) {
			return fail("record %d runs past the end of the file (truncated)", k)
		}
		nl := int(binary.LittleEndian.Uint16(raw[pos:]))
		pos += 2
		if !need(nl + 1) {
			return fail("record %d runs past the end of the file (truncated)", k)
		}
		name := string(raw[pos : pos+nl])
		pos += nl
		dl := int(raw[pos])
		pos++
		if !need(dl + 1) {
			return fail("record %q runs past the end of the file (truncated)", name)
		}
		dtype := string(raw[pos : pos+dl])
		pos += dl
		dt, err := tether.LookupDType(dtype)
		if err != nil {
			return fail("record %q has unknown dtype %q", name, dtype)
		}
		ndim := int(raw[pos])
		pos++
		if ndim > maxRank {
			return fail("record %q has rank %d, above %d", name, ndim, maxRank)
		}
		if !need(8*ndim + 8) {
			return fail("record %q runs past the end of the file (truncated)", name)
		}
		shape := make([]int64, ndim)
		elems := uint64(1)
		for i := range shape {
			shape[i] = int64(binary.LittleEndian.Uint64(raw[pos:]))
			pos += 8
			if shape[i] < 0 {
				return fail("record %q has a negative extent in shape %v", name, shape)
			}
			elems *= uint64(shape[i])
		}
		nbytes := binary.LittleEndian.Uint64(raw[pos:])
		pos += 8
		if nbytes != elems*uint64(dt.Size()) {
			return fail("record %q: nbytes %d disagrees with shape %v of %s", name, nbytes, shape, dtype)
		}
		pos += (paramsAlign - pos%paramsAlign) % paramsAlign
		if nbytes > uint64(len(raw)) || !need(int(nbytes)) {
			return fail("record %q runs past the end of the file (truncated)", name)
		}
		out[name] = Param{Name: name, Shape: shape, DType: dtype, Data: raw[pos : pos+int(nbytes)]}
		pos += int(nbytes)
	}
	return out, nil
}
