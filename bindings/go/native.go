package tether

// native.go is the only file of this package that speaks C: dlopen/dlsym, calls through function pointers,
// C-allocated (64-byte aligned) tensor memory and DLTensor records. Everything that crosses into a module lives
// in C memory, so cgo's pointer rules hold trivially: Go never hands C a pointer to Go memory that holds a Go
// pointer, and C never keeps a Go pointer after a call returns.

/*
#cgo CFLAGS: -I${SRCDIR}/../../src/tether/include -O2
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <sys/auxv.h>
#include <stdlib.h>
#include <string.h>
#include "tether_module.h"

// Go cannot call C function pointers: these one-line trampolines do it.
static int32_t tg_call_packed(void* f, const TetherValue* args, const int32_t* codes, int32_t n) {
  return ((TetherPackedFunc)f)(args, codes, n);
}
static void tg_call_void(void* f) { ((void (*)(void))f)(); }
static void tg_call_set_int(void* f, int32_t v) { ((void (*)(int32_t))f)(v); }
static int32_t tg_call_get_int(void* f) { return ((int32_t (*)(void))f)(); }
static void tg_set_launcher(void* setter, void* launcher) {
  ((void (*)(TetherParallelLauncher))setter)((TetherParallelLauncher)launcher);
}
static void* tg_aligned_alloc(size_t n) {
  void* p = NULL;
  if (n == 0) n = 1;
  if (posix_memalign(&p, 64, n) != 0) return NULL;
  memset(p, 0, n);
  return p;
}
static void* tg_dlopen(const char* path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
// The auxiliary vector (cpufeatures.go): AT_PLATFORM is a pointer to a string in the process's own stack.
static unsigned long tg_getauxval(unsigned long type) { return getauxval(type); }
static const char* tg_auxv_platform(void) { return (const char*)getauxval(AT_PLATFORM); }
static const char* tg_dlerror(void) { const char* e = dlerror(); return e ? e : "unknown dlopen error"; }

// One allocation holds the DLTensor and its shape.
static DLTensor* tg_new_dltensor(void* data, int32_t ndim, const int64_t* shape, uint8_t code, uint8_t bits) {
  DLTensor* t = (DLTensor*)calloc(1, sizeof(DLTensor) + sizeof(int64_t) * (ndim > 0 ? ndim : 1));
  if (!t) return NULL;
  int64_t* sh = (int64_t*)(t + 1);
  for (int32_t i = 0; i < ndim; i++) sh[i] = shape[i];
  t->data = data; t->device.device_type = kDLCPU; t->device.device_id = 0; t->ndim = ndim;
  t->dtype.code = code; t->dtype.bits = bits; t->dtype.lanes = 1; t->shape = sh; t->strides = NULL;
  t->byte_offset = 0;
  return t;
}
*/
import "C"

import (
	"errors"
	"unsafe"
)

const valueSize = C.sizeof_TetherValue

// auxv reads AT_HWCAP, AT_HWCAP2 and AT_PLATFORM of this process with getauxval (0 and "" when absent).
func auxv() (hwcap, hwcap2 uint64, platform string) {
	hwcap, hwcap2 = uint64(C.tg_getauxval(C.AT_HWCAP)), uint64(C.tg_getauxval(C.AT_HWCAP2))
	if p := C.tg_auxv_platform(); p != nil {
		platform = C.GoString(p)
	}
	return
}

// Type codes of packed arguments (docs/abi.md "Packed functions").
const (
	codeInt64    = C.TETHER_INT64
	codeFloat64  = C.TETHER_FLOAT64
	codeHandle   = C.TETHER_HANDLE
	codeDLTensor = C.TETHER_DLTENSOR
	codeStr      = C.TETHER_STR
	codeBytes    = C.TETHER_BYTES
	codeNull     = C.TETHER_NULL
)

func dlopen(path string) (unsafe.Pointer, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	h := C.tg_dlopen(cpath)
	if h == nil {
		return nil, errors.New(C.GoString(C.tg_dlerror()))
	}
	return h, nil
}

func dlsym(h unsafe.Pointer, name string) unsafe.Pointer {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.dlsym(h, cname)
}

func callPacked(f unsafe.Pointer, args unsafe.Pointer, codes unsafe.Pointer, n int) int32 {
	return int32(C.tg_call_packed(f, (*C.TetherValue)(args), (*C.int32_t)(codes), C.int32_t(n)))
}

func callVoid(f unsafe.Pointer)                   { C.tg_call_void(f) }
func callSetInt(f unsafe.Pointer, v int32)        { C.tg_call_set_int(f, C.int32_t(v)) }
func callGetInt(f unsafe.Pointer) int32           { return int32(C.tg_call_get_int(f)) }
func setLauncher(setter, launcher unsafe.Pointer) { C.tg_set_launcher(setter, launcher) }

// cAlloc returns n zeroed bytes of C memory aligned to 64 bytes (nil when out of memory).
func cAlloc(n int) unsafe.Pointer     { return C.tg_aligned_alloc(C.size_t(n)) }
func cFree(p unsafe.Pointer)          { C.free(p) }
func cCalloc(n int) unsafe.Pointer    { return C.calloc(1, C.size_t(n)) }
func cString(s string) unsafe.Pointer { return unsafe.Pointer(C.CString(s)) }

func newDLTensor(data unsafe.Pointer, shape []int64, code, bits uint8) unsafe.Pointer {
	var sp *C.int64_t
	if len(shape) > 0 {
		tmp := (*C.int64_t)(C.malloc(C.size_t(8 * len(shape))))
		copy(unsafe.Slice((*int64)(unsafe.Pointer(tmp)), len(shape)), shape)
		defer C.free(unsafe.Pointer(tmp))
		sp = tmp
	}
	return unsafe.Pointer(C.tg_new_dltensor(data, C.int32_t(len(shape)), sp, C.uint8_t(code), C.uint8_t(bits)))
}

// Accessors of one TetherValue slot (8 bytes: a union of int64, double and pointers) in a C array of values.
// They are plain memory writes, so binding arguments costs no cgo call.
func slot(base unsafe.Pointer, i int) unsafe.Pointer         { return unsafe.Add(base, i*valueSize) }
func setHandle(base unsafe.Pointer, i int, p unsafe.Pointer) { *(*unsafe.Pointer)(slot(base, i)) = p }
func setInt(base unsafe.Pointer, i int, v int64)             { *(*int64)(slot(base, i)) = v }
func setFloat(base unsafe.Pointer, i int, v float64)         { *(*float64)(slot(base, i)) = v }
func getHandle(base unsafe.Pointer, i int) unsafe.Pointer    { return *(*unsafe.Pointer)(slot(base, i)) }
func getInt(base unsafe.Pointer, i int) int64                { return *(*int64)(slot(base, i)) }
func getFloat(base unsafe.Pointer, i int) float64            { return *(*float64)(slot(base, i)) }
