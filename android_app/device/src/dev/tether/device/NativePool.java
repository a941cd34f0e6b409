package dev.tether.device;

import java.util.ArrayList;
import java.util.List;

/**
 * The native thread pool modules carry (docs/abi.md "The native pool", tether_rpc/parallel.py): the first module
 * loaded with {@code "thread_pool": 1} becomes the provider, its {@code tether_pool_launch} is installed in every
 * loaded module, and {@code num_threads - 1} native threads (started by the bridge, never Java threads) sit in
 * its {@code tether_pool_worker} until the session ends. Without a provider, modules run their loops serially.
 */
final class NativePool {
    private NativeModule provider;
    private long threads;
    private final List<NativeModule> modules = new ArrayList<NativeModule>();

    static int numThreads() {
        String env = System.getenv("TETHER_NUM_THREADS");
        if (env != null && !env.trim().isEmpty()) {
            try {
                int n = Integer.parseInt(env.trim());
                if (n >= 1) {
                    return n;
                }
            } catch (NumberFormatException e) {
                // fall through to the CPU count
            }
        }
        return Math.max(1, Runtime.getRuntime().availableProcessors());
    }

    boolean running() {
        return threads != 0;
    }

    /** A module was loaded: maybe make it the provider, and give it the launcher. */
    void add(NativeModule m) {
        modules.add(m);
        int n = numThreads();
        if (provider == null && m.hasPool() && n > 1) {
            provider = m;
            m.acquire();  // the workers run its code: it stays loaded until they have returned
            threads = NativeBridge.startThreads(m.poolWorker, n - 1);
            for (NativeModule other : modules) {
                install(other);
            }
            return;
        }
        install(m);
    }

    private void install(NativeModule m) {
        if (provider != null && m.setLauncher != 0 && m.loaded()) {
            NativeBridge.callWithPointer(m.setLauncher, provider.poolLaunch);
        }
    }

    int workers() {
        return threads != 0 ? NativePool.numThreads() - 1 : 0;
    }

    /** Every worker returns after its current task; waits for them. */
    void shutdown() {
        if (threads != 0) {
            NativeBridge.callVoid(provider.poolShutdown);
            NativeBridge.joinThreads(threads);
            threads = 0;
        }
    }

    void releaseProvider() {
        if (provider != null) {
            provider.release();
            provider = null;
        }
        modules.clear();
    }
}
