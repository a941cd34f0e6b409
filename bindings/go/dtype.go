package tether

import "fmt"

// DType describes an element type by its tether name (the table in rpc_server/tether_rpc/dtypes.py).
type DType struct {
	Name string
	Code uint8 // DLPack type code: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
	Bits uint8 // storage width (bool is stored as one byte)
}

// Size is the number of bytes one element takes.
func (d DType) Size() int { return int(d.Bits) / 8 }

var dtypes = map[string]DType{}

func init() {
	for _, d := range []DType{
		{"bool", 6, 8}, {"int8", 0, 8}, {"uint8", 1, 8}, {"int16", 0, 16}, {"uint16", 1, 16},
		{"int32", 0, 32}, {"uint32", 1, 32}, {"int64", 0, 64}, {"uint64", 1, 64},
		{"float16", 2, 16}, {"bfloat16", 4, 16}, {"float32", 2, 32}, {"float64", 2, 64},
	} {
		dtypes[d.Name] = d
	}
}

// LookupDType returns the element type called name ("float32", "int8", ...).
func LookupDType(name string) (DType, error) {
	d, ok := dtypes[name]
	if !ok {
		return DType{}, fmt.Errorf("tether: unknown dtype %q (known: bool, int8..int64, uint8..uint64, float16, bfloat16, float32, float64)", name)
	}
	return d, nil
}
