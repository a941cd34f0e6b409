package dev.tether.device;

import dev.tether.rpc.FrameCodec;

import java.net.Socket;
import java.nio.ByteBuffer;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.logging.Logger;

/**
 * What the client of a session run in this process (thread isolation: Android) is told when a kernel crashes it:
 * the ERROR SessionCrashed rpc-server sends for a crashed session worker (request id 0, the signal named), written
 * to the socket by the bridge's signal handler just before the process dies. The frames, one per fatal signal, are
 * encoded here before the session starts, so the handler only has to write(2) bytes it is given.
 */
final class CrashReport {
    private static final Logger LOG = Logger.getLogger(CrashReport.class.getName());
    /** The fatal signals the bridge handles; their numbers are the same on x86_64, arm and arm64 Linux. */
    static final String[] NAMES = {"SIGILL", "SIGABRT", "SIGBUS", "SIGFPE", "SIGSEGV"};
    static final int[] NUMBERS = {4, 6, 7, 8, 11};

    private final ByteBuffer frames;   // referenced while armed: the bridge holds its address

    private CrashReport(ByteBuffer frames) {
        this.frames = frames;
    }

    /** Once per process, after the VM is up; false (logged) if the handler could not be installed. */
    static boolean install() {
        boolean ok = NativeBridge.installCrashHandler();
        if (!ok) {
            LOG.warning("could not install the crash handler: a crashing kernel drops its client's connection");
        }
        return ok;
    }

    /** The ERROR frame rpc-server sends when a session dies from {@code name} ({@code number}). */
    static byte[] frame(String name, int number) {
        Map<String, Object> p = new LinkedHashMap<String, Object>();
        p.put("type", "SessionCrashed");
        p.put("message", "the session worker died from " + name + " (" + number + "), probably in a kernel; the "
                + "session ran in the device server's process, which died with it: start a new session once the "
                + "device is back");
        p.put("traceback", "");
        return FrameCodec.encodeFrame(Wire.ERROR, 0, p);
    }

    /** Arms the report for the session on {@code socket} (null if its descriptor cannot be found: logged). */
    static CrashReport arm(Socket socket) {
        int fd = NativeBridge.socketFd(socket.getLocalPort(), socket.getPort());
        if (fd < 0) {
            LOG.warning("no descriptor found for the session's socket: a crashing kernel drops the connection");
            return null;
        }
        byte[][] encoded = new byte[NAMES.length][];
        int total = 0;
        for (int i = 0; i < NAMES.length; i++) {
            encoded[i] = frame(NAMES[i], NUMBERS[i]);
            total += encoded[i].length;
        }
        ByteBuffer frames = ByteBuffer.allocateDirect(total);
        long base = NativeBridge.address(frames);
        for (int i = 0; i < NAMES.length; i++) {
            NativeBridge.setCrashFrame(NUMBERS[i], base + frames.position(), encoded[i].length);
            frames.put(encoded[i]);
        }
        NativeBridge.setCrashFd(fd);
        return new CrashReport(frames);
    }

    /**
     * Disarms {@code report} (null: nothing armed) before its socket closes (its descriptor may be reused). The
     * frames stay in place until the report is unreachable: a kernel still running may be reading them.
     */
    static void disarm(CrashReport report) {
        if (report != null) {
            NativeBridge.setCrashFd(-1);
        }
    }
}
