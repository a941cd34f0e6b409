package tether

import (
	"fmt"
	"unsafe"
)

// Tensor is a dense row-major array in C memory, passed to kernels as a DLTensor without copying.
//
// Its memory is 64-byte aligned C memory (so cgo's pointer rules allow handing it to a module), exposed to Go
// as slices with zero copy (Float32s, Bytes, ...). A Tensor made by NewTensor owns its memory and must be
// released with Close; a view (View) shares its parent's memory and must not outlive it.
type Tensor struct {
	dl     unsafe.Pointer // *DLTensor, C memory
	data   unsafe.Pointer
	nbytes int
	shape  []int64
	dtype  DType
	owned  bool
}

func numel(shape []int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("tether: negative extent in shape %v", shape)
		}
		n *= d
	}
	return n, nil
}

// layout resolves a dtype name and a shape to the dtype and the byte size of a dense tensor of them.
func layout(shape []int64, dtype string) (DType, int, error) {
	dt, err := LookupDType(dtype)
	if err != nil {
		return DType{}, 0, err
	}
	n, err := numel(shape)
	if err != nil {
		return DType{}, 0, err
	}
	return dt, int(n) * dt.Size(), nil
}

// NewTensor allocates a zero-filled tensor of the given shape and dtype name.
func NewTensor(shape []int64, dtype string) (*Tensor, error) {
	dt, nbytes, err := layout(shape, dtype)
	if err != nil {
		return nil, err
	}
	data := cAlloc(nbytes)
	if data == nil {
		return nil, fmt.Errorf("tether: out of memory allocating %d bytes for a %s%v tensor", nbytes, dtype, shape)
	}
	t := newTensorOver(data, nbytes, shape, dt)
	t.owned = true
	return t, nil
}

func newTensorOver(data unsafe.Pointer, nbytes int, shape []int64, dt DType) *Tensor {
	sh := append([]int64(nil), shape...)
	return &Tensor{dl: newDLTensor(data, sh, dt.Code, dt.Bits), data: data, nbytes: nbytes, shape: sh, dtype: dt}
}

// View returns a tensor over nbytes of this tensor's memory starting at byteOffset, with its own shape and
// dtype (how the graph executor lays entries over shared storages). The view must not outlive t.
func (t *Tensor) View(byteOffset int, shape []int64, dtype string) (*Tensor, error) {
	dt, nbytes, err := layout(shape, dtype)
	if err != nil {
		return nil, err
	}
	if byteOffset < 0 || byteOffset%dt.Size() != 0 {
		return nil, fmt.Errorf("tether: view offset %d is not a multiple of the %s element size %d", byteOffset, dtype, dt.Size())
	}
	if byteOffset+nbytes > t.nbytes {
		return nil, fmt.Errorf("tether: view of bytes %d..%d exceeds the %d bytes of its tensor", byteOffset, byteOffset+nbytes, t.nbytes)
	}
	return newTensorOver(unsafe.Add(t.data, byteOffset), nbytes, shape, dt), nil
}

// Close releases the tensor's C memory (idempotent). For a view it releases only the DLTensor record.
func (t *Tensor) Close() {
	if t.dl == nil {
		return
	}
	cFree(t.dl)
	if t.owned {
		cFree(t.data)
	}
	t.dl, t.data, t.nbytes = nil, nil, 0
}

func (t *Tensor) Shape() []int64 { return append([]int64(nil), t.shape...) }
func (t *Tensor) DType() string  { return t.dtype.Name }
func (t *Tensor) NumBytes() int  { return t.nbytes }

// Numel is the number of elements.
func (t *Tensor) Numel() int { return t.nbytes / t.dtype.Size() }

// Pointer is the address of the first element (C memory).
func (t *Tensor) Pointer() unsafe.Pointer { return t.data }

// Bytes is the tensor's memory as a byte slice (no copy; valid until Close).
func (t *Tensor) Bytes() []byte {
	if t.nbytes == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(t.data), t.nbytes)
}

func typedSlice[T any](t *Tensor, want ...string) []T {
	for _, w := range want {
		if t.dtype.Name == w {
			if t.nbytes == 0 {
				return nil
			}
			var zero T
			return unsafe.Slice((*T)(t.data), t.nbytes/int(unsafe.Sizeof(zero)))
		}
	}
	panic(fmt.Sprintf("tether: tensor is %s, not %v", t.dtype.Name, want))
}

// Typed zero-copy views; each panics if the dtype differs (a programming error, like an index out of range).
func (t *Tensor) Float32s() []float32 { return typedSlice[float32](t, "float32") }
func (t *Tensor) Float64s() []float64 { return typedSlice[float64](t, "float64") }
func (t *Tensor) Int8s() []int8       { return typedSlice[int8](t, "int8") }
func (t *Tensor) Uint8s() []uint8     { return typedSlice[uint8](t, "uint8", "bool") }
func (t *Tensor) Int16s() []int16     { return typedSlice[int16](t, "int16") }
func (t *Tensor) Uint16s() []uint16   { return typedSlice[uint16](t, "uint16", "float16", "bfloat16") }
func (t *Tensor) Int32s() []int32     { return typedSlice[int32](t, "int32") }
func (t *Tensor) Int64s() []int64     { return typedSlice[int64](t, "int64") }

// CopyFrom copies raw bytes (little-endian elements, row-major) into the tensor; the sizes must match.
func (t *Tensor) CopyFrom(src []byte) error {
	if len(src) != t.nbytes {
		return fmt.Errorf("tether: copying %d bytes into a %s%v tensor of %d bytes", len(src), t.dtype.Name, t.shape, t.nbytes)
	}
	copy(t.Bytes(), src)
	return nil
}
