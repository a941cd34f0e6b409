package dev.tether.device;

import java.nio.charset.Charset;

/**
 * A failing OpenCL call, thrown by the bridge (tether_bridge.c): the call, the CL error code and, for a failed
 * build, the driver's build log. The message names the call and the error as tether_rpc/gpu/opencl.py does
 * ("clCreateBuffer failed: CL_INVALID_BUFFER_SIZE (-61)"); {@link #toDeviceError} makes it the ERROR a client sees
 * (GpuBuildError for a build, GpuError otherwise).
 */
public final class ClError extends RuntimeException {
    private static final long serialVersionUID = 1L;
    /** Characters of a build log kept (the first errors are what matters; a log can run to megabytes). */
    static final int MAX_BUILD_LOG = 16000;

    public final String call;
    public final int code;
    public final String log;

    public ClError(String call, int code, byte[] log) {
        super(call + " failed: " + OpenCL.errorName(code) + " (" + code + ")");
        this.call = call;
        this.code = code;
        this.log = log == null ? null : new String(log, Charset.forName("UTF-8")).trim();
    }

    /** The client's error, {@code what} (a kernel, a device) added to the call's own words. */
    DeviceError toDeviceError(String what) {
        String text = call + (what != null ? "(" + what + ")" : "") + " failed: " + OpenCL.errorName(code) + " ("
                + code + ")";
        if (log != null) {
            String l = log.length() > MAX_BUILD_LOG ? log.substring(0, MAX_BUILD_LOG) + "\n... (" + (log.length()
                    - MAX_BUILD_LOG) + " more characters of build log)" : log;
            return new DeviceError("GpuBuildError", text + "\n" + l, this);
        }
        return new DeviceError("GpuError", text, this);
    }
}
