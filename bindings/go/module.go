package tether

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"sync"
	"unsafe"
)

// ABIVersion is the packed-function ABI this runtime speaks (docs/abi.md).
const ABIVersion = 1

const metaSection = ".tether_meta"

// ArgInfo describes one tensor parameter of a compiled function, from the module's metadata.
type ArgInfo struct {
	Name  string  `json:"name"`
	Shape []int64 `json:"shape"`
	DType string  `json:"dtype"`
}

// FuncInfo describes one packed function of a module.
type FuncInfo struct {
	Name     string    `json:"name"`
	Args     []ArgInfo `json:"args"`
	Parallel bool      `json:"parallel"`
}

// Metadata is the module's __tether_metadata JSON (docs/abi.md "Metadata").
type Metadata struct {
	ABIVersion    int            `json:"abi_version"`
	TetherVersion string         `json:"tether_version"`
	Target        map[string]any `json:"target"`
	Functions     []FuncInfo     `json:"functions"`
	ParallelTasks string         `json:"parallel_tasks"`
	ThreadPool    int            `json:"thread_pool"`
	// HostFunctions lists the registered host functions the module calls at run time (docs/abi.md "Host callbacks").
	HostFunctions []string `json:"host_functions"`
	// Requires is what the code needs of the CPU ({"isa", "features"}; docs/abi.md): checked before dlopen.
	Requires any `json:"requires"`
	// CPUDispatch names the bits of the module's CPU-features word, lowest first (docs/abi.md "CPU dispatch").
	CPUDispatch any `json:"cpu_dispatch"`
	// Device is a GPU module's device code description ({"api": "opencl", ...}; docs/gpu.md): this runtime has no
	// GPU to run it on, so such a module is refused before dlopen.
	Device any `json:"device"`
}

var archMachine = map[string]elf.Machine{"x86_64": elf.EM_X86_64, "aarch64": elf.EM_AARCH64, "armv7": elf.EM_ARM}

func hostArch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	case "arm":
		return "armv7"
	}
	return runtime.GOARCH
}

func machineArch(m elf.Machine) string {
	for a, mm := range archMachine {
		if mm == m {
			return a
		}
	}
	return m.String()
}

// InspectModule vets a module file without loading it: ELF header (architecture, shared object), metadata
// (ABI version, target arch agreeing with the header, functions exported). Nothing of the file runs.
func InspectModule(path string) (*Metadata, error) {
	label := filepath.Base(path)
	fail := func(format string, a ...any) (*Metadata, error) {
		return nil, &LoadError{Path: label, Reason: fmt.Sprintf(format, a...)}
	}
	f, err := elf.Open(path)
	if err != nil {
		return fail("not a readable ELF file: %v", err)
	}
	defer f.Close()
	built, here := machineArch(f.Machine), hostArch()
	if built != here || (f.Class == elf.ELFCLASS32) != (unsafe.Sizeof(uintptr(0)) == 4) {
		return nil, &LoadError{Path: label, ArchMismatch: true, Reason: fmt.Sprintf(
			"built for %s (%s) but this process is %s: rebuild it with the target for this device", built, f.Class, here)}
	}
	if f.Type != elf.ET_DYN {
		return fail("not a shared library (ELF type %s); export modules with export_library", f.Type)
	}
	sec := f.Section(metaSection)
	if sec == nil {
		return fail("no %s section: it is not a tether module (build it with tether.build and Module.export_library)", metaSection)
	}
	raw, err := sec.Data()
	if err != nil {
		return fail("cannot read %s: %v", metaSection, err)
	}
	end := bytes.IndexByte(raw, 0)
	if end < 0 {
		return fail("metadata in %s is not NUL-terminated (corrupt module)", metaSection)
	}
	var meta Metadata
	if err := json.Unmarshal(raw[:end], &meta); err != nil {
		return fail("metadata in %s is not valid JSON: %v", metaSection, err)
	}
	if meta.ABIVersion != ABIVersion {
		return fail("uses tether ABI version %d but this runtime speaks version %d: rebuild the module with a matching tether",
			meta.ABIVersion, ABIVersion)
	}
	if a, ok := meta.Target["arch"].(string); ok && archMachine[a] != f.Machine {
		return fail("metadata says arch %q but the ELF header says %s (corrupt or mislabelled module)", a, built)
	}
	if err := checkCPU(&meta, label); err != nil {
		return nil, err
	}
	if meta.Device != nil {
		api := "a GPU"
		if d, ok := meta.Device.(map[string]any); ok {
			if a, ok := d["api"].(string); ok {
				api = a
			}
		}
		return fail("this device runs CPU modules only; %s needs %s, which is not available", label, api)
	}
	syms, _ := f.DynamicSymbols()
	exported := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF {
			exported[s.Name] = true
		}
	}
	for _, fn := range meta.Functions {
		if fn.Name == "" || !exported[fn.Name] {
			return fail("metadata lists function %q but the library does not export it", fn.Name)
		}
	}
	return &meta, nil
}

// Module is a loaded tether module. Its library stays mapped for the life of the process (a module may be the
// thread pool's provider, and a function of it may be running on another goroutine), as in the Python runtime.
type Module struct {
	Path     string
	Metadata *Metadata
	handle   unsafe.Pointer
	setter   unsafe.Pointer // tether_set_parallel_launcher
	infos    map[string]*FuncInfo
	mu       sync.Mutex
	funcs    map[string]*Function
	// dispatchWord is the CPU-features word set at load (which versions of dispatched kernels run)
	dispatchWord uint32
}

// LoadModule vets the file (InspectModule), then dlopens it, installs the parallel launcher (the native pool,
// workers on goroutines locked to OS threads) and resolves the host functions its metadata names.
func LoadModule(path string) (*Module, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, &LoadError{Path: path, Reason: err.Error()}
	}
	meta, err := InspectModule(abs)
	if err != nil {
		return nil, err
	}
	label := filepath.Base(abs)
	for _, name := range meta.HostFunctions {
		if lookupHostFunc(name) == nil {
			return nil, &LoadError{Path: label, Reason: fmt.Sprintf(
				"needs host function %q, which is not registered in this process: register it with tether.RegisterFunc(%q, ...) before loading", name, name)}
		}
	}
	h, err := dlopen(abs)
	if err != nil {
		return nil, &LoadError{Path: label, Reason: "dlopen failed: " + err.Error()}
	}
	m := &Module{Path: abs, Metadata: meta, handle: h, infos: map[string]*FuncInfo{}, funcs: map[string]*Function{}}
	// kernels compiled twice pick their version from the features this CPU reports (metadata "cpu_dispatch")
	m.dispatchWord = setDispatchWord(h, meta.CPUDispatch, ThisCPU(), label)
	for i := range meta.Functions {
		m.infos[meta.Functions[i].Name] = &meta.Functions[i]
	}
	if err := bindHostFunctions(m); err != nil {
		return nil, err
	}
	m.setter = dlsym(h, "tether_set_parallel_launcher")
	installLauncher(m)
	return m, nil
}

// FunctionNames lists the packed functions in metadata order.
func (m *Module) FunctionNames() []string {
	out := make([]string, len(m.Metadata.Functions))
	for i, f := range m.Metadata.Functions {
		out[i] = f.Name
	}
	return out
}

// GetFunction returns the packed function called name.
func (m *Module) GetFunction(name string) (*Function, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.funcs[name]; f != nil {
		return f, nil
	}
	info := m.infos[name]
	if info == nil {
		return nil, fmt.Errorf("tether: %s has no function %q; it has: %v", filepath.Base(m.Path), name, m.FunctionNames())
	}
	sym := dlsym(m.handle, name)
	if sym == nil {
		return nil, &LoadError{Path: filepath.Base(m.Path), Reason: "does not export " + name}
	}
	f := &Function{name: name, sym: sym, info: info, hostNames: m.Metadata.HostFunctions}
	m.funcs[name] = f
	return f, nil
}

// Function is a packed function of a loaded module. It is safe to call from several goroutines at once.
type Function struct {
	name      string
	sym       unsafe.Pointer
	info      *FuncInfo
	hostNames []string
}

func (f *Function) Name() string   { return f.name }
func (f *Function) Info() FuncInfo { return *f.info }

// packed holds converted arguments: values and codes in Go memory holding only C pointers and numbers (which
// cgo allows passing to C), plus C strings/bytes records to free after the call.
type packed struct {
	values []uint64
	codes  []int32
	cmem   []unsafe.Pointer
}

func (p *packed) free() {
	for _, c := range p.cmem {
		cFree(c)
	}
	p.cmem = nil
}

func (f *Function) pack(args []any) (*packed, error) {
	n := len(args)
	p := &packed{values: make([]uint64, n+1), codes: make([]int32, n+1)}
	base := unsafe.Pointer(&p.values[0])
	bad := func(i int, format string, a ...any) (*packed, error) {
		p.free()
		argname := ""
		if i < len(f.info.Args) {
			argname = fmt.Sprintf(" '%s'", f.info.Args[i].Name)
		}
		return nil, &KernelError{Func: f.name, Message: fmt.Sprintf("%s: argument %d%s %s", f.name, i, argname, fmt.Sprintf(format, a...))}
	}
	for i, a := range args {
		switch v := a.(type) {
		case *Tensor:
			if v == nil || v.dl == nil {
				return bad(i, "is a nil or closed tensor")
			}
			setHandle(base, i, v.dl)
			p.codes[i] = codeDLTensor
		case int:
			setInt(base, i, int64(v))
			p.codes[i] = codeInt64
		case int32:
			setInt(base, i, int64(v))
			p.codes[i] = codeInt64
		case int64:
			setInt(base, i, v)
			p.codes[i] = codeInt64
		case uint64:
			if v > math.MaxInt64 {
				return bad(i, "= %d does not fit in int64", v)
			}
			setInt(base, i, int64(v))
			p.codes[i] = codeInt64
		case bool:
			b := int64(0)
			if v {
				b = 1
			}
			setInt(base, i, b)
			p.codes[i] = codeInt64
		case float64:
			setFloat(base, i, v)
			p.codes[i] = codeFloat64
		case float32:
			setFloat(base, i, float64(v))
			p.codes[i] = codeFloat64
		case string:
			s := cString(v)
			p.cmem = append(p.cmem, s)
			setHandle(base, i, s)
			p.codes[i] = codeStr
		case []byte:
			data := cAlloc(len(v))
			copy(unsafe.Slice((*byte)(data), len(v)), v)
			rec := cCalloc(16) // TetherBytes {const void* data; uint64_t size;}
			*(*unsafe.Pointer)(rec) = data
			*(*uint64)(unsafe.Add(rec, unsafe.Sizeof(uintptr(0)))) = uint64(len(v))
			p.cmem = append(p.cmem, data, rec)
			setHandle(base, i, rec)
			p.codes[i] = codeBytes
		case nil:
			setHandle(base, i, nil)
			p.codes[i] = codeNull
		default:
			return bad(i, "has unsupported type %T (pass *Tensor, int, int64, float64, string, []byte or nil)", a)
		}
	}
	return p, nil
}

// Call runs the function on args: *Tensor (passed as a DLTensor, zero copy), integers, floats, strings,
// []byte and nil. A nonzero return code becomes a *KernelError with the module's message.
func (f *Function) Call(args ...any) error {
	p, err := f.pack(args)
	if err != nil {
		return err
	}
	rc := callPacked(f.sym, unsafe.Pointer(&p.values[0]), unsafe.Pointer(&p.codes[0]), len(args))
	p.free()
	runtime.KeepAlive(args)
	if rc != 0 {
		return f.decodeError(rc, args)
	}
	return nil
}

// Bound is a function with its arguments converted once: Run costs one cgo call and a return-code check.
// The tensors must stay open while it is used; Close frees the converted strings and bytes.
type Bound struct {
	f    *Function
	p    *packed
	args []any
}

// Bind converts args once for repeated calls (timing loops, the graph executor).
func (f *Function) Bind(args ...any) (*Bound, error) {
	p, err := f.pack(args)
	if err != nil {
		return nil, err
	}
	return &Bound{f: f, p: p, args: args}, nil
}

// Run calls the function on the bound arguments.
func (b *Bound) Run() error {
	rc := callPacked(b.f.sym, unsafe.Pointer(&b.p.values[0]), unsafe.Pointer(&b.p.codes[0]), len(b.args))
	if rc != 0 {
		return b.f.decodeError(rc, b.args)
	}
	return nil
}

// Close frees the converted arguments (idempotent).
func (b *Bound) Close() {
	if b.p != nil {
		b.p.free()
		b.p = nil
	}
}
