// Package rpc is a pure-Go client of the tether RPC protocol (docs/protocol.md) and tracker (docs/tracker.md):
// connect with a token, upload, load modules, device arrays, calls, time_evaluator with streamed samples,
// device_info, and sessions requested through a tracker.
package rpc

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Options configure a session. Zero values take the defaults.
type Options struct {
	Token          string        // the server's token; required beyond loopback
	ConnectTimeout time.Duration // default 10 s
	Timeout        time.Duration // each reply (and bulk transfer); default 60 s
	Wait           bool          // queue behind a busy device instead of failing with DeviceBusy
	Client         string        // name sent in HELLO (default "tether-go")
	Match          string        // one-time token from a tracker (set by Tracker.Request)
	OnQueued       func(position int64)
}

func (o *Options) defaults() {
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	if o.Client == "" {
		o.Client = "tether-go"
	}
}

// Session is one connection to a device server. Calls are serialised (one at a time); Close is idempotent.
type Session struct {
	endpoint
	opts    Options
	Welcome *Map
	Addr    string
}

// Connect opens a session with the device server at addr ("host:port").
func Connect(addr string, opts Options) (*Session, error) {
	opts.defaults()
	c, err := dial(addr, opts.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	hello := NewMap("magic", "tether-rpc", "version", ProtocolVersion, "caps", []any{"bulk", "events"},
		"wait", opts.Wait, "client", opts.Client)
	if opts.Match != "" {
		hello.Set("match", opts.Match)
	}
	onEvent := func(ev *Map) {
		if k, _ := ev.Get("kind"); k == "queued" && opts.OnQueued != nil {
			p, _ := ev.Get("position")
			pos, _ := p.(int64)
			opts.OnQueued(pos)
		}
	}
	// a queued client may wait long for its WELCOME: the handshake wait is the session timeout
	welcome, err := c.handshake(coreHandshake, hello, opts.Token, "the server at "+addr, opts.Timeout, onEvent)
	if err != nil {
		c.close()
		return nil, err
	}
	if v, _ := welcome.Get("version"); v != int64(ProtocolVersion) {
		c.close()
		return nil, fmt.Errorf("tether/rpc: the server at %s speaks protocol version %v, this client speaks %d", addr, v, ProtocolVersion)
	}
	c.limits = DefaultLimits
	return &Session{endpoint: endpoint{conn: c, nextID: 1}, opts: opts, Welcome: welcome, Addr: addr}, nil
}

// Close ends the session (CLOSE, then the connection); idempotent.
func (s *Session) Close() error {
	return s.end(func() { _ = s.conn.send(MsgClose, 0, NewMap("reason", "client closed"), nil, time.Second) })
}

// Event is an EVENT frame of a call (sample, progress, log, node, ...).
type Event struct {
	Kind    string
	Payload *Map
}

// Reply is what a call returned: the RETURN payload's value, the payload itself and any bulk bytes.
type Reply struct {
	Value   any
	Payload *Map
	Bulk    []byte
}

// Call sends one CALL of fn (a built-in name or a Handle) with args and an optional bulk, and waits for its
// RETURN or ERROR, passing EVENTs to onEvent. A *RemoteError leaves the session usable; a request-id-0 ERROR
// (the session crashed or timed out) and protocol errors close it.
func (s *Session) Call(fn any, args []any, bulk []byte, onEvent func(Event)) (*Reply, error) {
	return s.call(fn, args, bulk, onEvent, -1)
}

// call is Call with expectBulk >= 0 when the reply's bulk size is known: a different size is refused before
// anything is allocated for it (a peer cannot make the client allocate what it did not ask for).
func (s *Session) call(fn any, args []any, bulk []byte, onEvent func(Event), expectBulk int64) (*Reply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("tether/rpc: the session with %s is closed", s.Addr)
	}
	if args == nil {
		args = []any{}
	}
	rid := s.nextID
	s.nextID++
	payload := NewMap("fn", fn, "args", args)
	if bulk != nil {
		payload.Set("nbytes", int64(len(bulk)))
	}
	if err := s.conn.send(MsgCall, rid, payload, bulk, s.opts.Timeout); err != nil {
		s.abort()
		return nil, err
	}
	for {
		fr, err := s.conn.readFrame(s.opts.Timeout)
		if err != nil {
			s.abort()
			return nil, err
		}
		if fr.RequestID == 0 && fr.Type == MsgError {
			s.abort()
			return nil, remoteError(fr.Payload)
		}
		if fr.RequestID != rid && fr.RequestID != 0 {
			s.abort()
			return nil, &ProtocolError{Msg: fmt.Sprintf("reply for request %d while waiting for %d", fr.RequestID, rid)}
		}
		switch fr.Type {
		case MsgEvent:
			if onEvent != nil {
				k, _ := fr.Payload.Get("kind")
				ks, _ := k.(string)
				onEvent(Event{Kind: ks, Payload: fr.Payload})
			}
		case MsgError:
			return nil, remoteError(fr.Payload)
		case MsgReturn:
			r := &Reply{Payload: fr.Payload}
			r.Value, _ = fr.Payload.Get("value")
			if nb, ok := fr.Payload.Get("nbytes"); ok {
				n, ok := nb.(int64)
				if !ok || n < 0 || (expectBulk >= 0 && n != expectBulk) {
					s.abort()
					return nil, &ProtocolError{Msg: fmt.Sprintf("reply announces %v bulk bytes (expected %d)", nb, expectBulk)}
				}
				if r.Bulk, err = s.conn.readBulk(n, s.opts.Timeout); err != nil {
					s.abort()
					return nil, err
				}
			}
			return r, nil
		case MsgClose:
			s.abort()
			return nil, fmt.Errorf("tether/rpc: the server at %s closed the session", s.Addr)
		default:
			s.abort()
			return nil, &ProtocolError{Msg: fmt.Sprintf("unexpected message type %d in reply to a CALL", fr.Type)}
		}
	}
}

func (s *Session) simple(fn string, args ...any) (any, error) {
	r, err := s.Call(fn, args, nil, nil)
	if err != nil {
		return nil, err
	}
	return r.Value, nil
}

func asMap(v any, what string) (*Map, error) {
	m, ok := v.(*Map)
	if !ok {
		return nil, &ProtocolError{Msg: fmt.Sprintf("%s returned %T, expected a map", what, v)}
	}
	return m, nil
}

func field[T any](m *Map, k, what string) (T, error) {
	v, _ := m.Get(k)
	t, ok := v.(T)
	if !ok {
		var zero T
		return zero, &ProtocolError{Msg: fmt.Sprintf("%s: field %q is %T, expected %T", what, k, v, zero)}
	}
	return t, nil
}

// Echo returns its single argument (or the list of arguments) as the server sees it.
func (s *Session) Echo(args ...any) (any, error) { return s.simple("tether.echo", args...) }

// DeviceInfo returns the device's arch, CPUs, memory, suggested target preset, ...
func (s *Session) DeviceInfo() (*Map, error) {
	v, err := s.simple("tether.device_info")
	if err != nil {
		return nil, err
	}
	return asMap(v, "tether.device_info")
}

// Upload stores data as name in the session folder (a plain file name).
func (s *Session) Upload(name string, data []byte) error {
	_, err := s.Call("tether.upload", []any{name}, data, nil)
	return err
}

// UploadFile uploads a local file under its base name.
func (s *Session) UploadFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	name := filepath.Base(path)
	return name, s.Upload(name, data)
}

// Download fetches a file of the session folder.
func (s *Session) Download(name string) ([]byte, error) {
	r, err := s.Call("tether.download", []any{name}, nil, nil)
	if err != nil {
		return nil, err
	}
	return r.Bulk, nil
}

// handleCall calls fn and returns the handle the reply's map names under "handle", and that map, for the
// calls that create a remote object.
func (s *Session) handleCall(fn string, args ...any) (Handle, *Map, error) {
	v, err := s.simple(fn, args...)
	if err != nil {
		return 0, nil, err
	}
	m, err := asMap(v, fn)
	if err != nil {
		return 0, nil, err
	}
	h, err := field[Handle](m, "handle", fn)
	if err != nil {
		return 0, nil, err
	}
	return h, m, nil
}

// Free releases a remote object.
func (s *Session) Free(h Handle) error {
	_, err := s.simple("tether.free", h)
	return err
}

// RemoteModule is a module loaded on the device.
type RemoteModule struct {
	s         *Session
	Handle    Handle
	Functions []string
	Metadata  *Map
}

// LoadModule loads an uploaded module by name.
func (s *Session) LoadModule(name string) (*RemoteModule, error) {
	h, m, err := s.handleCall("tether.module.load", name)
	if err != nil {
		return nil, err
	}
	fl, _ := field[[]any](m, "functions", "tether.module.load")
	rm := &RemoteModule{s: s, Handle: h}
	for _, f := range fl {
		if str, ok := f.(string); ok {
			rm.Functions = append(rm.Functions, str)
		}
	}
	rm.Metadata, _ = field[*Map](m, "metadata", "tether.module.load")
	return rm, nil
}

// RemoteFunc is a function on the device: of a module, or a registered host function.
type RemoteFunc struct {
	s      *Session
	Handle Handle
	Name   string
}

// GetFunction returns the module's function called name.
func (m *RemoteModule) GetFunction(name string) (*RemoteFunc, error) {
	h, _, err := m.s.handleCall("tether.module.get_function", m.Handle, name)
	if err != nil {
		return nil, err
	}
	return &RemoteFunc{s: m.s, Handle: h, Name: name}, nil
}

// GetFunction returns a function the device offers by name (e.g. one loaded with rpc-server --functions).
func (s *Session) GetFunction(name string) (*RemoteFunc, error) {
	h, _, err := s.handleCall("tether.get_function", name)
	if err != nil {
		return nil, err
	}
	return &RemoteFunc{s: s, Handle: h, Name: name}, nil
}

func wireArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		if ra, ok := a.(*RemoteArray); ok {
			out[i] = ra.Handle
		} else {
			out[i] = a
		}
	}
	return out
}

// Call runs the function: *RemoteArray (by handle), *WireTensor (copied in; the reply's tensors, as they are
// after the call, are returned in order), numbers, strings, []byte. It returns the function's value.
func (f *RemoteFunc) Call(args ...any) (any, []*WireTensor, error) {
	r, err := f.s.Call(f.Handle, wireArgs(args), nil, nil)
	if err != nil {
		return nil, nil, err
	}
	var ts []*WireTensor
	if tl, ok := r.Payload.Get("tensors"); ok {
		if arr, ok := tl.([]any); ok {
			for _, t := range arr {
				if wt, ok := t.(*WireTensor); ok {
					ts = append(ts, wt)
				}
			}
		}
	}
	return r.Value, ts, nil
}

// TimeOptions are time_evaluator's settings (zero fields take the device's defaults).
type TimeOptions struct {
	Number, Repeat, Warmup  int
	MinRepeatMs, CooldownMs float64
}

// Timing is a time_evaluator result: seconds per call for each sample.
type Timing struct {
	Samples []float64
	Number  int64
}

// TimeEvaluator times the function on the device; onSample gets each sample (index, seconds per call) as the
// device measures it (streamed EVENTs).
func (f *RemoteFunc) TimeEvaluator(o TimeOptions, onSample func(index int64, seconds float64), args ...any) (*Timing, error) {
	opts := NewMap()
	if o.Number > 0 {
		opts.Set("number", o.Number)
	}
	if o.Repeat > 0 {
		opts.Set("repeat", o.Repeat)
	}
	if o.Warmup > 0 {
		opts.Set("warmup", o.Warmup)
	}
	if o.MinRepeatMs > 0 {
		opts.Set("min_repeat_ms", o.MinRepeatMs)
	}
	if o.CooldownMs > 0 {
		opts.Set("cooldown_ms", o.CooldownMs)
	}
	r, err := f.s.Call("tether.time_evaluator", []any{f.Handle, wireArgs(args), opts}, nil, func(ev Event) {
		if ev.Kind == "sample" && onSample != nil {
			i, _ := ev.Payload.Get("index")
			sec, _ := ev.Payload.Get("seconds")
			ii, _ := i.(int64)
			ss, _ := sec.(float64)
			onSample(ii, ss)
		}
	})
	if err != nil {
		return nil, err
	}
	m, err := asMap(r.Value, "tether.time_evaluator")
	if err != nil {
		return nil, err
	}
	samples, err := field[[]any](m, "samples", "tether.time_evaluator")
	if err != nil {
		return nil, err
	}
	t := &Timing{}
	t.Number, _ = field[int64](m, "number", "tether.time_evaluator")
	for _, v := range samples {
		sec, ok := v.(float64)
		if !ok {
			return nil, &ProtocolError{Msg: "time_evaluator sample is not a float"}
		}
		t.Samples = append(t.Samples, sec)
	}
	return t, nil
}

// RemoteArray is a device array.
type RemoteArray struct {
	s      *Session
	Handle Handle
	Shape  []int64
	DType  string
	NBytes int64
}

func (s *Session) arrayFrom(v any, what string) (*RemoteArray, error) {
	m, err := asMap(v, what)
	if err != nil {
		return nil, err
	}
	h, err := field[Handle](m, "handle", what)
	if err != nil {
		return nil, err
	}
	dt, _ := field[string](m, "dtype", what)
	shp, _ := field[[]any](m, "shape", what)
	a := &RemoteArray{s: s, Handle: h, DType: dt}
	size, ok := wireItemSize[dt]
	if !ok {
		return nil, &ProtocolError{Msg: what + " returned dtype " + dt}
	}
	n := int64(1)
	for _, d := range shp {
		di, _ := d.(int64)
		a.Shape = append(a.Shape, di)
		n *= di
	}
	a.NBytes = n * int64(size)
	return a, nil
}

// Empty allocates a zeroed device array.
func (s *Session) Empty(shape []int64, dtype string) (*RemoteArray, error) {
	v, err := s.simple("tether.array.empty", shape, dtype)
	if err != nil {
		return nil, err
	}
	return s.arrayFrom(v, "tether.array.empty")
}

// Array allocates a device array holding t (its bytes travel as bulk, so any size works).
func (s *Session) Array(t *WireTensor) (*RemoteArray, error) {
	a, err := s.Empty(t.Shape, t.DType)
	if err != nil {
		return nil, err
	}
	if err := a.CopyIn(t.Data); err != nil {
		return nil, err
	}
	return a, nil
}

// CopyIn overwrites the array with data (exactly its byte size, little-endian elements).
func (a *RemoteArray) CopyIn(data []byte) error {
	if int64(len(data)) != a.NBytes {
		return fmt.Errorf("tether/rpc: copying %d bytes into a device array of %d bytes", len(data), a.NBytes)
	}
	_, err := a.s.Call("tether.array.copy_in", []any{a.Handle}, data, nil)
	return err
}

// Bytes copies the array's contents back.
func (a *RemoteArray) Bytes() ([]byte, error) {
	r, err := a.s.call("tether.array.copy_out", []any{a.Handle}, nil, nil, a.NBytes)
	if err != nil {
		return nil, err
	}
	if int64(len(r.Bulk)) != a.NBytes {
		return nil, &ProtocolError{Msg: fmt.Sprintf("copy_out sent %d bytes for an array of %d", len(r.Bulk), a.NBytes)}
	}
	return r.Bulk, nil
}

// Free releases the array on the device.
func (a *RemoteArray) Free() error { return a.s.Free(a.Handle) }
