package tether

// Host callbacks (docs/abi.md "Host callbacks", TVM's call_packed): Go functions registered by name, called by
// compiled modules at run time. A module lists the names it calls in its metadata ("host_functions");
// LoadModule refuses it if one is not registered, and otherwise installs tetherGoHostCall as its host caller.

/*
#include <stdint.h>
#include "tether_module.h"
extern int32_t tetherGoHostCall(char* name, TetherValue* args, int32_t* codes, int32_t n, TetherValue* ret,
                                int32_t* ret_code);
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// Value is a host function argument or result: int64, float64, string, []byte or nil (results may also be
// any Go integer or float type, or bool).
type Value = any

// HostFunc is a Go function a compiled module may call by name.
type HostFunc func(args ...Value) (Value, error)

var hostFuncs sync.Map // name -> HostFunc

// RegisterFunc makes fn callable by compiled modules (te.call_packed(name, ...)) in this process. Register before
// loading a module that needs it; a name can be registered once (RemoveFunc first to replace it).
func RegisterFunc(name string, fn HostFunc) error {
	if name == "" || fn == nil {
		return fmt.Errorf("tether: RegisterFunc needs a name and a function")
	}
	if _, loaded := hostFuncs.LoadOrStore(name, fn); loaded {
		return fmt.Errorf("tether: host function %q is already registered (RemoveFunc it first)", name)
	}
	return nil
}

// RemoveFunc unregisters name (modules already loaded keep calling through the registry and fail cleanly).
func RemoveFunc(name string) { hostFuncs.Delete(name) }

func lookupHostFunc(name string) HostFunc {
	v, ok := hostFuncs.Load(name)
	if !ok {
		return nil
	}
	return v.(HostFunc)
}

const errHostCall = 9

// the latest failure, process-wide: a failing call may run on a pool worker thread, not the caller's
var lastHostError struct {
	sync.Mutex
	name string
	err  error
}

func keepHostError(name string, err error) {
	lastHostError.Lock()
	lastHostError.name, lastHostError.err = name, err
	lastHostError.Unlock()
}

func takeHostError() (string, error) {
	lastHostError.Lock()
	defer lastHostError.Unlock()
	name, err := lastHostError.name, lastHostError.err
	lastHostError.name, lastHostError.err = "", nil
	return name, err
}

func bindHostFunctions(m *Module) error {
	if len(m.Metadata.HostFunctions) == 0 {
		return nil
	}
	setter := dlsym(m.handle, "tether_set_host_caller")
	if setter == nil {
		return &LoadError{Path: m.Path, Reason: "lists host functions but does not export tether_set_host_caller"}
	}
	setLauncher(setter, unsafe.Pointer(C.tetherGoHostCall))
	return nil
}

//export tetherGoHostCall
func tetherGoHostCall(name *C.char, args *C.TetherValue, codes *C.int32_t, n C.int32_t, ret *C.TetherValue,
	retCode *C.int32_t) (rc C.int32_t) {
	fname := C.GoString(name)
	defer func() {
		if p := recover(); p != nil { // a panic must not unwind into native code
			keepHostError(fname, fmt.Errorf("panic: %v", p))
			rc = 1
		}
	}()
	fn := lookupHostFunc(fname)
	if fn == nil {
		keepHostError(fname, fmt.Errorf("host function %q is not registered", fname))
		return 1
	}
	base, cs := unsafe.Pointer(args), unsafe.Slice((*int32)(unsafe.Pointer(codes)), int(n))
	vals := make([]Value, int(n))
	for i := range vals {
		switch cs[i] {
		case codeInt64:
			vals[i] = getInt(base, i)
		case codeFloat64:
			vals[i] = getFloat(base, i)
		case codeStr:
			vals[i] = C.GoString((*C.char)(getHandle(base, i)))
		case codeBytes:
			rec := getHandle(base, i)
			size := *(*uint64)(unsafe.Add(rec, unsafe.Sizeof(uintptr(0))))
			vals[i] = C.GoBytes(*(*unsafe.Pointer)(rec), C.int(size))
		case codeNull:
			vals[i] = nil
		default:
			keepHostError(fname, fmt.Errorf("argument %d has unsupported type code %d", i, cs[i]))
			return 1
		}
	}
	res, err := fn(vals...)
	if err != nil {
		keepHostError(fname, err)
		return 1
	}
	out := unsafe.Pointer(ret)
	code := int32(codeInt64)
	switch v := res.(type) {
	case nil:
		setInt(out, 0, 0)
		code = codeNull
	case int:
		setInt(out, 0, int64(v))
	case int32:
		setInt(out, 0, int64(v))
	case int64:
		setInt(out, 0, v)
	case uint32:
		setInt(out, 0, int64(v))
	case bool:
		b := int64(0)
		if v {
			b = 1
		}
		setInt(out, 0, b)
	case float64:
		setFloat(out, 0, v)
		code = codeFloat64
	case float32:
		setFloat(out, 0, float64(v))
		code = codeFloat64
	default:
		keepHostError(fname, fmt.Errorf("returned %T; kernels take integers or floats", res))
		return 1
	}
	*(*int32)(unsafe.Pointer(retCode)) = code
	return 0
}
