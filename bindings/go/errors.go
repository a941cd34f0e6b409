package tether

import "fmt"

// LoadError: a module could not be loaded (not a tether module, corrupt metadata, dlopen failure, a host
// function it needs is not registered). ArchMismatch is set when it was built for another architecture.
type LoadError struct {
	Path         string
	Reason       string
	ArchMismatch bool
}

func (e *LoadError) Error() string { return "tether: " + e.Path + ": " + e.Reason }

// KernelError: a packed function returned a nonzero code (docs/abi.md "Return codes") or refused its arguments.
// Message is the readable form the Python runtime gives for the same code.
type KernelError struct {
	Func    string
	Code    uint32 // 0 when the call was refused before reaching the module
	Message string
}

func (e *KernelError) Error() string { return e.Message }

func fmtShape(s []int64) string {
	if len(s) == 1 {
		return fmt.Sprintf("(%d,)", s[0])
	}
	out := "("
	for i, d := range s {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprint(d)
	}
	return out + ")"
}

// launcherInternalError is the task code the Python launcher reports for its own failures (parallel.py).
const launcherInternalError = 0xFFFFFF

// decodeError turns a return code into the message tether_rpc.module.PackedFunc.decode_error gives.
func (f *Function) decodeError(rc int32, args []any) *KernelError {
	code := uint32(rc)
	kind, i, d, low24 := code>>24, int((code>>8)&0xFFFF), int(code&0xFF), code&0xFFFFFF
	name := f.name
	var exp ArgInfo
	hasExp := i < len(f.info.Args)
	if hasExp {
		exp = f.info.Args[i]
	}
	ename := ""
	if hasExp && exp.Name != "" {
		ename = fmt.Sprintf(" '%s'", exp.Name)
	}
	actualKind, actualShape, actualDType := "?", []int64(nil), ""
	if i < len(args) {
		actualKind, actualShape, actualDType = describe(args[i])
	}
	var msg string
	switch kind {
	case 1:
		names := ""
		for k, a := range f.info.Args {
			if k > 0 {
				names += ", "
			}
			names += a.Name
		}
		msg = fmt.Sprintf("%s: expected %d arguments (%s), got %d", name, len(f.info.Args), names, low24)
	case 2:
		msg = fmt.Sprintf("%s: argument %d%s must be an array, got %s", name, i, ename, actualKind)
	case 3:
		msg = fmt.Sprintf("%s: argument %d%s has %d dimensions, expected %d", name, i, ename, len(actualShape), len(exp.Shape))
	case 4:
		msg = fmt.Sprintf("%s: argument %d%s has dtype %s, expected %s", name, i, ename, actualDType, exp.DType)
	case 5:
		msg = fmt.Sprintf("%s: argument %d%s has shape %s, expected %s (dimension %d differs)", name, i, ename,
			fmtShape(actualShape), fmtShape(exp.Shape), d)
	case 6:
		msg = fmt.Sprintf("%s: argument %d%s is not a compact row-major array (dimension %d)", name, i, ename, d)
	case 7:
		msg = fmt.Sprintf("%s: argument %d%s has a NULL data pointer", name, i, ename)
	case errHostCall:
		hname, herr := takeHostError()
		if hname == "" && int(low24) < len(f.hostNames) {
			hname = f.hostNames[low24]
		}
		if herr == nil {
			herr = fmt.Errorf("no host caller installed or it returned an error")
		}
		msg = fmt.Sprintf("%s: host function '%s' failed: %v", name, hname, herr)
	case 8:
		if hname, herr := takeHostError(); herr != nil {
			msg = fmt.Sprintf("%s: in a parallel task: host function '%s' failed: %v", name, hname, herr)
			break
		}
		if low24 == launcherInternalError {
			msg = fmt.Sprintf("%s: the parallel launcher failed", name)
		} else {
			msg = fmt.Sprintf("%s: a parallel task failed with code %d", name, low24)
		}
	default:
		msg = fmt.Sprintf("%s: failed with return code %d (0x%08x)", name, rc, code)
	}
	return &KernelError{Func: name, Code: code, Message: msg}
}

func describe(v any) (string, []int64, string) {
	if t, ok := v.(*Tensor); ok && t != nil {
		return "array", t.shape, t.dtype.Name
	}
	return fmt.Sprintf("%T", v), nil, ""
}
