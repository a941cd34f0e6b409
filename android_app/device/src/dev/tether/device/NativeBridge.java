package dev.tether.device;

import java.io.File;
import java.nio.ByteBuffer;

/**
 * The JNI bridge to tether modules (libtether_bridge.so, android_app/bridge/tether_bridge.c): dlopen/dlsym, the
 * packed call over argument arrays built in direct buffers, the timing loop in native code, and the threads
 * a module's native pool borrows (they stay parked in native code, never in Java).
 *
 * Addresses are passed as longs (a 32-bit ARM pointer fits). Everything here is static: the library is global.
 */
public final class NativeBridge {
    public static final String LIBRARY = "tether_bridge";

    private static boolean loaded;

    private NativeBridge() {
    }

    /** Load libtether_bridge.so from {@code dir} (if given) or from java.library.path. Idempotent. */
    public static synchronized void load(String dir) {
        if (loaded) {
            return;
        }
        if (dir != null) {
            File f = new File(dir, System.mapLibraryName(LIBRARY));
            if (f.isFile()) {
                System.load(f.getAbsolutePath());
                loaded = true;
                return;
            }
        }
        System.loadLibrary(LIBRARY);
        loaded = true;
    }

    /** dlopen(path, RTLD_NOW | RTLD_LOCAL); 0 on failure (then {@link #dlerror} says why). */
    public static native long dlopen(String path);

    public static native String dlerror();

    /** dlsym; 0 if the symbol is missing. */
    public static native long dlsym(long lib, String name);

    public static native int dlclose(long lib);

    /** A 32-bit store at {@code address}: a module's CPU-features word, found with {@link #dlsym}. */
    public static native void storeInt(long address, int value);

    /** The address of a direct buffer's first byte. */
    public static native long address(ByteBuffer direct);

    /** sizeof(void*) of this process: 8 or 4. */
    public static native int pointerSize();

    /** {@code int32_t fn(const TetherValue* values, const int32_t* codes, int32_t n)}: the packed call. */
    public static native int callPacked(long fn, long values, long codes, int n);

    /**
     * Calls the packed function {@code number} times in a native loop and returns the elapsed CLOCK_MONOTONIC
     * nanoseconds, or {@code -1 - (rc & 0xffffffff)} if a call returned {@code rc != 0} (the loop stops there).
     */
    public static native long timeCalls(long fn, long values, long codes, int n, int number);

    /** {@code void fn(void* arg)}: tether_set_parallel_launcher and the like. */
    public static native void callWithPointer(long fn, long arg);

    /** {@code void fn(void)}: tether_pool_shutdown, tether_pool_reset. */
    public static native void callVoid(long fn);

    /** {@code int32_t fn(void)}: tether_pool_num_workers. */
    public static native int callInt(long fn);

    /**
     * Starts {@code count} native threads that each call {@code void worker(void)} (a module's
     * tether_pool_worker) and returns a handle for {@link #joinThreads}, or 0 if no thread could start.
     */
    public static native long startThreads(long worker, int count);

    /**
     * Makes file descriptor 1 a copy of 2 and returns a new descriptor for the old stdout (or -1): a session
     * worker JVM then owns its protocol stream alone (the JVM's fatal-error report goes to fd 1).
     */
    public static native int takeStdout();

    // -- the crash report of in-process sessions (CrashReport) --------------------------------------------------

    /**
     * Installs the handler of SIGILL, SIGABRT, SIGBUS, SIGFPE and SIGSEGV once (after the VM's own): a signal
     * raised in module code writes the frame of {@link #setCrashFrame} to the descriptor of {@link #setCrashFd}
     * and kills the process; any other goes on to the VM's handler. False if sigaction failed.
     */
    public static native boolean installCrashHandler();

    /** The frame ({@code length} bytes at {@code address}, kept alive by the caller) for {@code signal}. */
    public static native void setCrashFrame(int signal, long address, int length);

    /** The session socket's descriptor, or -1 for none. */
    public static native void setCrashFd(int fd);

    /** How many fatal signals the handler passed on to the VM's handler (a test's proof that it chains). */
    public static native long chainedSignals();

    /** The descriptor of this process's TCP socket with these local and peer ports, or -1. */
    public static native int socketFd(int localPort, int peerPort);

    /** Waits for the threads of {@link #startThreads} to return (after tether_pool_shutdown) and frees the handle. */
    public static native void joinThreads(long threads);

    // -- OpenCL, dlopened at run time (OpenCL.java); every failing call throws ClError naming it -------------

    /** dlopen the OpenCL library at {@code path} and resolve its entry points: null on success, else why not. */
    public static native String clLoad(String path);

    public static native boolean clLoaded();

    /** {platform, device} handle pairs: GPUs and accelerators of every platform, then CPU devices. */
    public static native long[] clDevices();

    /** The raw bytes of clGetPlatformInfo ({@code platform}) or clGetDeviceInfo for {@code param}. */
    public static native byte[] clInfo(boolean platform, long handle, int param);

    public static native long clCreateContext(long device);

    /** An in-order command queue with CL_QUEUE_PROFILING_ENABLE. */
    public static native long clCreateQueue(long context, long device);

    /** Release: kind 0 cl_mem, 1 cl_kernel, 2 cl_program, 3 cl_command_queue, 4 cl_context. */
    public static native void clRelease(int kind, long handle);

    public static native long clAlloc(long context, long nbytes);

    /** Blocking clEnqueueWriteBuffer of {@code n} bytes at byte {@code pos} of a direct buffer. */
    public static native void clWrite(long queue, long mem, long offset, ByteBuffer src, long pos, long n);

    /** Blocking clEnqueueReadBuffer of {@code n} bytes into byte {@code pos} of a direct buffer. */
    public static native void clRead(long queue, long mem, long offset, ByteBuffer dst, long pos, long n);

    public static native void clCopy(long queue, long dst, long src, long n);

    /** A built cl_program; a failed build throws ClError carrying the driver's build log. */
    public static native long clBuild(long context, long device, byte[] source, String options);

    public static native long clKernel(long program, String name);

    /** {num_args, CL_KERNEL_WORK_GROUP_SIZE, reqd_work_group_size x, y, z (0 0 0: none)}. */
    public static native long[] clKernelInfo(long kernel, long device);

    /**
     * Sets the arguments ({@code kinds}: 0 cl_mem, 1 int32, 2 float32 bits, each in {@code values}) and enqueues
     * the kernel; {@code timed}: waits for it and returns its profiled device nanoseconds, else 0.
     */
    public static native long clLaunch(long queue, long kernel, int[] kinds, long[] values, long[] global,
                                       long[] local, int dims, boolean timed);

    public static native void clFinish(long queue);
}
