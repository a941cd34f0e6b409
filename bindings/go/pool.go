package tether

// The module's native thread pool (docs/abi.md "The native pool", docs/parallel.md): the first module loaded
// with "thread_pool": 1 becomes the provider; its tether_pool_launch is installed as the parallel launcher of
// every loaded module, and NumThreads()-1 goroutines, each locked to its own OS thread, park inside its
// tether_pool_worker. A launch is then native code from start to end: no cgo callback, no Go scheduler.

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"
)

const poolJoinTimeout = 5 * time.Second

type nativePool struct {
	launch, worker, shutdown, setSpin, numWorkers unsafe.Pointer
	running                                       sync.WaitGroup
}

var poolState struct {
	mu         sync.Mutex
	provider   *nativePool
	setters    []unsafe.Pointer
	numThreads int
}

// DefaultNumThreads is TETHER_NUM_THREADS if set to a positive integer, else the CPUs Go may use.
func DefaultNumThreads() int {
	if env := strings.TrimSpace(os.Getenv("TETHER_NUM_THREADS")); env != "" {
		if n, err := strconv.Atoi(env); err == nil && n >= 1 {
			return n
		}
	}
	return runtime.GOMAXPROCS(0)
}

func currentThreads() int {
	if poolState.numThreads == 0 {
		poolState.numThreads = DefaultNumThreads()
	}
	return poolState.numThreads
}

// installLauncher is called by LoadModule: adopt a provider if this is the first pool-carrying module, then
// install the launcher (or NULL at one thread, so the module runs its native serial loop).
func installLauncher(m *Module) {
	poolState.mu.Lock()
	defer poolState.mu.Unlock()
	if m.setter == nil {
		return
	}
	if poolState.provider == nil && m.Metadata.ThreadPool == 1 {
		p := &nativePool{
			launch: dlsym(m.handle, "tether_pool_launch"), worker: dlsym(m.handle, "tether_pool_worker"),
			shutdown: dlsym(m.handle, "tether_pool_shutdown"), setSpin: dlsym(m.handle, "tether_pool_set_spin"),
			numWorkers: dlsym(m.handle, "tether_pool_num_workers"),
		}
		if p.launch != nil && p.worker != nil && p.shutdown != nil && p.setSpin != nil && p.numWorkers != nil {
			if env := strings.TrimSpace(os.Getenv("TETHER_POOL_SPIN")); env != "" {
				if n, err := strconv.Atoi(env); err == nil && n >= 0 {
					callSetInt(p.setSpin, int32(n))
				}
			}
			poolState.provider = p
			p.start(currentThreads())
		}
	}
	poolState.setters = append(poolState.setters, m.setter)
	// every module, also one loaded before the provider (a hand-written C module), gets the current launcher
	l := launcherLocked()
	for _, s := range poolState.setters {
		setLauncher(s, l)
	}
}

func launcherLocked() unsafe.Pointer {
	if poolState.provider == nil || currentThreads() <= 1 {
		return nil
	}
	return poolState.provider.launch
}

func (p *nativePool) start(numThreads int) {
	want := numThreads - 1
	for i := 0; i < want; i++ {
		p.running.Add(1)
		go func() {
			// The worker never returns to Go until shutdown; locking keeps the goroutine and its OS thread
			// together for the whole stay, and no other goroutine is scheduled onto that thread.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			defer p.running.Done()
			callVoid(p.worker)
		}()
	}
	deadline := time.Now().Add(poolJoinTimeout)
	for int(callGetInt(p.numWorkers)) < want && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
}

func (p *nativePool) stop() error {
	callVoid(p.shutdown)
	done := make(chan struct{})
	go func() { p.running.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(poolJoinTimeout):
		return fmt.Errorf("tether: native pool workers did not leave within %s (a task is still running)", poolJoinTimeout)
	}
}

// SetNumThreads uses n threads (the caller included) for parallel loops from now on; 1 means serial. The
// native pool's workers are stopped (bounded wait) and n-1 new ones started.
func SetNumThreads(n int) error {
	if n < 1 {
		return fmt.Errorf("tether: SetNumThreads needs at least 1 thread, got %d", n)
	}
	poolState.mu.Lock()
	defer poolState.mu.Unlock()
	poolState.numThreads = n
	var err error
	if p := poolState.provider; p != nil {
		for _, s := range poolState.setters {
			setLauncher(s, nil) // no module launches into the pool while it restarts
		}
		err = p.stop()
		p.start(n)
	}
	l := launcherLocked()
	for _, s := range poolState.setters {
		setLauncher(s, l)
	}
	return err
}

// NumThreads is the number of threads a parallel launch uses (the caller included).
func NumThreads() int {
	poolState.mu.Lock()
	defer poolState.mu.Unlock()
	return currentThreads()
}

// PoolWorkers is the number of threads currently parked in the native pool (0 before a pool module is loaded).
func PoolWorkers() int {
	poolState.mu.Lock()
	defer poolState.mu.Unlock()
	if poolState.provider == nil {
		return 0
	}
	return int(callGetInt(poolState.provider.numWorkers))
}

// SetPoolSpin sets the idle spin iterations of the native pool's workers before they sleep (0 = sleep at once).
func SetPoolSpin(n int) {
	poolState.mu.Lock()
	defer poolState.mu.Unlock()
	if poolState.provider != nil {
		callSetInt(poolState.provider.setSpin, int32(n))
	}
}
