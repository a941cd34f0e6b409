package dev.tether.device;

import dev.tether.rpc.Frame;
import dev.tether.rpc.FrameCodec;
import dev.tether.rpc.Limits;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.Socket;

/**
 * The client -> session worker half of a child-JVM session ({@link SessionProcess}). It forwards frame by frame
 * (header and body in one write, bulk bytes after them) so that it sees a CLOSE the moment it arrives, even
 * behind pipelined calls whose worker is busy in a kernel: as rpc-server does, a CLOSE ends the session at once
 * and the running call (and the calls pipelined before the CLOSE) get no answer. Bytes it cannot frame (a
 * malformed or oversized frame) are passed on as they are, for the worker to refuse.
 */
final class ClientRelay implements Runnable {
    /** What ended the relay: the worker is to be killed for the first two. */
    enum End { CLOSE, HANG_UP, SERVER_CLOSED, WORKER_GONE }

    private final Socket client;
    private final InputStream in;
    private final OutputStream toWorker;
    private final Runnable killWorker;
    private final Wire reader;
    private volatile End end;

    ClientRelay(Socket client, InputStream in, OutputStream toWorker, Runnable killWorker) {
        this.client = client;
        this.in = in;
        this.toWorker = toWorker;
        this.killWorker = killWorker;
        this.reader = new Wire(in, null);
    }

    End end() {
        return end;
    }

    public void run() {
        try {
            end = relay();
        } catch (IOException e) {
            end = client.isClosed() ? End.SERVER_CLOSED : End.HANG_UP;
        }
        if (end == End.CLOSE || end == End.HANG_UP) {
            killWorker.run();   // free the device at once, even mid-kernel
        }
    }

    private boolean readFully(byte[] b) throws IOException {
        Wire.spin(in);
        return reader.readFully(b, 0, b.length);
    }

    private End relay() throws IOException {
        byte[] header = new byte[4];
        while (true) {
            if (!readFully(header)) {
                return End.HANG_UP;
            }
            int n;
            try {
                n = FrameCodec.checkedLength(header, 0, Limits.DEFAULT);
            } catch (IOException e) {   // oversized: the worker refuses it from the header alone
                return forward(header, null) ? raw() : End.WORKER_GONE;
            }
            byte[] body = new byte[n];
            if (!readFully(body)) {
                return End.HANG_UP;
            }
            long bulk;
            try {
                Frame f = FrameCodec.decodeBody(body, Limits.DEFAULT);
                if (f.type == Wire.CLOSE) {
                    return End.CLOSE;
                }
                bulk = f.bulkSize(Limits.DEFAULT);
            } catch (IOException e) {   // malformed: the worker says so and ends the session
                return forward(header, body) ? raw() : End.WORKER_GONE;
            }
            if (!forward(header, body)) {
                return End.WORKER_GONE;
            }
            if (bulk > 0 && !copy(bulk)) {
                return End.WORKER_GONE;
            }
        }
    }

    private boolean forward(byte[] header, byte[] body) {
        try {
            if (body == null) {
                toWorker.write(header);
            } else {
                byte[] frame = new byte[header.length + body.length];
                System.arraycopy(header, 0, frame, 0, header.length);
                System.arraycopy(body, 0, frame, header.length, body.length);
                toWorker.write(frame);
            }
            toWorker.flush();
            return true;
        } catch (IOException e) {
            return false;
        }
    }

    /** Copies {@code n} bulk bytes; false if the worker is gone. A hang-up midway throws. */
    private boolean copy(long n) throws IOException {
        byte[] buf = new byte[(int) Math.min(n, 1 << 16)];
        while (n > 0) {
            Wire.spin(in);
            int k = in.read(buf, 0, (int) Math.min(n, buf.length));
            if (k < 0) {
                throw new IOException("the client hung up during bulk bytes");
            }
            try {
                toWorker.write(buf, 0, k);
                toWorker.flush();
            } catch (IOException e) {
                return false;
            }
            n -= k;
        }
        return true;
    }

    /** Everything else as it comes (after a frame the worker refuses, the session is ending anyway). */
    private End raw() throws IOException {
        byte[] buf = new byte[1 << 16];
        while (true) {
            int k = in.read(buf);
            if (k < 0) {
                return End.HANG_UP;
            }
            try {
                toWorker.write(buf, 0, k);
                toWorker.flush();
            } catch (IOException e) {
                return End.WORKER_GONE;
            }
        }
    }
}
