package rpc

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-ml/tether/bindings/go/internal/gofixtures"
)

// rpcFixturesHint: how to get $TETHER_GO_FIXTURES set for this package's tests.
const rpcFixturesHint = "run through pytest tests/test_go_rpc.py"

// Interop with a real device server and a real tracker, started by tests/test_go_rpc.py, which writes their
// addresses, the kernel, its inputs and numpy's result into $TETHER_GO_FIXTURES/cases.json.

type tensorFile = gofixtures.TensorFile

type interopSetup struct {
	Hostile                      map[string]string
	Server, Token, Tracker, Vadd string
	A, B, Sum                    tensorFile
	dir                          string
}

func setup(t *testing.T) *interopSetup {
	dir := gofixtures.Dir(t, rpcFixturesHint)
	var s interopSetup
	gofixtures.ReadJSON(t, dir, "cases.json", &s)
	s.dir = dir
	return &s
}

func (s *interopSetup) tensor(t *testing.T, tf tensorFile) *WireTensor {
	raw, err := os.ReadFile(filepath.Join(s.dir, tf.File))
	if err != nil {
		t.Fatal(err)
	}
	return &WireTensor{DType: tf.DType, Shape: tf.Shape, Data: raw}
}

// runVadd uploads the kernel, runs it on device arrays and on tensors, and streams time_evaluator samples.
func runVadd(t *testing.T, s *interopSetup, sess *Session) {
	t.Helper()
	name, err := sess.UploadFile(s.Vadd)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := sess.LoadModule(name)
	if err != nil {
		t.Fatal(err)
	}
	if len(mod.Functions) == 0 || mod.Functions[0] != "vadd" {
		t.Fatalf("module functions %v", mod.Functions)
	}
	f, err := mod.GetFunction("vadd")
	if err != nil {
		t.Fatal(err)
	}
	a, b, want := s.tensor(t, s.A), s.tensor(t, s.B), s.tensor(t, s.Sum)
	ra, err := sess.Array(a)
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := sess.Array(b)
	rc, err := sess.Empty(a.Shape, "float32")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Call(ra, rb, rc); err != nil {
		t.Fatal(err)
	}
	got, err := rc.Bytes()
	if err != nil || !bytes.Equal(got, want.Data) {
		t.Fatalf("vadd on device arrays differs from numpy (%v)", err)
	}
	// tensors travel in the CALL and come back in the RETURN as they are after the call
	zero := &WireTensor{DType: "float32", Shape: a.Shape, Data: make([]byte, len(a.Data))}
	_, ts, err := f.Call(a, b, zero)
	if err != nil || len(ts) != 3 || !bytes.Equal(ts[2].Data, want.Data) {
		t.Fatalf("vadd on tensors: %v, %d tensors back", err, len(ts))
	}
	var streamed []float64
	tm, err := f.TimeEvaluator(TimeOptions{Number: 20, Repeat: 5}, func(i int64, sec float64) {
		if int(i) != len(streamed) {
			t.Errorf("sample %d arrived as number %d", i, len(streamed))
		}
		streamed = append(streamed, sec)
	}, ra, rb, rc)
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Samples) != 5 || len(streamed) != 5 || tm.Number != 20 {
		t.Fatalf("time_evaluator: %+v, streamed %v", tm, streamed)
	}
	for i := range streamed {
		if streamed[i] != tm.Samples[i] || !(streamed[i] > 0 && streamed[i] < 1) {
			t.Fatalf("sample %d: streamed %g, returned %g", i, streamed[i], tm.Samples[i])
		}
	}
	t.Logf("vadd on %s: median of 5 samples %.2f us", sess.Addr, median(tm.Samples)*1e6)
	// a remote error names the problem and leaves the session usable
	short, _ := sess.Empty([]int64{1000}, "float32")
	_, _, err = f.Call(ra, short, rc)
	var re *RemoteError
	if !errors.As(err, &re) || re.Type != "KernelError" || !strings.Contains(re.Message, "argument 1 'B' has shape (1000,), expected (1024,)") {
		t.Fatalf("bad call: %v", err)
	}
	for _, arr := range []*RemoteArray{ra, rb, rc, short} {
		if err := arr.Free(); err != nil {
			t.Fatal(err)
		}
	}
}

func median(s []float64) float64 {
	c := append([]float64(nil), s...)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if c[j] < c[i] {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c[len(c)/2]
}

func TestServer(t *testing.T) {
	s := setup(t)
	if _, err := Connect(s.Server, Options{Timeout: 10 * time.Second}); err == nil || !strings.Contains(err.Error(), "requires a token") {
		t.Fatalf("no token: %v", err)
	}
	_, err := Connect(s.Server, Options{Token: "wrong", Timeout: 10 * time.Second})
	var re *RemoteError
	if !errors.As(err, &re) || re.Type != "AuthenticationError" {
		t.Fatalf("wrong token: %v", err)
	}
	sess, err := Connect(s.Server, Options{Token: s.Token, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	values := []any{int64(-1), int64(300), int64(1) << 40, 1.5, "héllo", nil, true, []byte{0, 255},
		[]any{int64(1), []any{int64(2), NewMap("k", "v")}}}
	got, err := sess.Echo(values...)
	if err != nil || !valuesEqual(got, values) {
		t.Fatalf("echo: %v %#v", err, got)
	}
	info, err := sess.DeviceInfo()
	if err != nil {
		t.Fatal(err)
	}
	if arch, _ := info.Get("arch"); arch != "x86_64" && arch != "aarch64" {
		t.Fatalf("device_info arch %v", arch)
	}
	big := bytes.Repeat([]byte("tether"), 200000) // bulk both ways, beyond one frame's small-call path
	if err := sess.Upload("blob.bin", big); err != nil {
		t.Fatal(err)
	}
	if back, err := sess.Download("blob.bin"); err != nil || !bytes.Equal(back, big) {
		t.Fatalf("download: %v", err)
	}
	if err := sess.Upload("../escape", []byte("x")); err == nil {
		t.Fatal("an unsafe upload name was accepted")
	}
	// a host function the server loaded with --functions, called by name (it runs in the session worker)
	greet, err := sess.GetFunction("device.greet")
	if err != nil {
		t.Fatal(err)
	}
	if v, _, err := greet.Call("héllo", 3); err != nil || v != 15.5 {
		t.Fatalf("device.greet: %v %v", v, err)
	}
	if _, err := sess.GetFunction("nope"); err == nil || !strings.Contains(err.Error(), "offers no function 'nope'") {
		t.Fatalf("an unknown host function: %v", err)
	}
	runVadd(t, s, sess)
	if err := sess.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sess.Echo(1); err == nil {
		t.Fatal("a closed session answered")
	}
	sess.Close() // idempotent
}

func TestTracker(t *testing.T) {
	s := setup(t)
	tr, err := ConnectTracker(s.Tracker, "", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	sum, err := tr.Summary()
	if err != nil {
		t.Fatal(err)
	}
	devs, _ := sum.Get("devices")
	if len(devs.([]any)) != 2 {
		t.Fatalf("summary devices %v", devs)
	}
	for _, key := range []string{"go-direct", "go-reverse"} {
		sess, err := tr.Request(key, 1, 30*time.Second, 120*time.Second, Options{Timeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		runVadd(t, s, sess)
		sess.Close()
	}
	if _, err := tr.Reserve("no-such-key", 1, 500*time.Millisecond, 10*time.Second, nil); err == nil {
		t.Fatal("a request for a key nobody registered was granted")
	}
}

// TestHostileServers: a server that announces an oversized frame, sends garbage or stays silent gets a typed
// error within the timeout, never a hang or a huge allocation.
func TestHostileServers(t *testing.T) {
	s := setup(t)
	opts := Options{Timeout: 2 * time.Second, ConnectTimeout: 2 * time.Second}
	_, err := Connect(s.Hostile["oversized"], opts)
	var ft *FrameTooLarge
	if !errors.As(err, &ft) || !strings.Contains(err.Error(), "exceeds the limit of 65536") {
		t.Fatalf("oversized frame: %v", err)
	}
	_, err = Connect(s.Hostile["garbage"], opts)
	var pe *ProtocolError
	if !errors.As(err, &pe) {
		t.Fatalf("garbage: %v", err)
	}
	t0 := time.Now()
	_, err = Connect(s.Hostile["silent"], opts)
	var te *TimeoutError
	if !errors.As(err, &te) || time.Since(t0) > 10*time.Second {
		t.Fatalf("silent server: %v after %v", err, time.Since(t0))
	}
}
