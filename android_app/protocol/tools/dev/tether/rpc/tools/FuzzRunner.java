package dev.tether.rpc.tools;

import dev.tether.rpc.Frame;
import dev.tether.rpc.FrameDecoder;
import dev.tether.rpc.Limits;
import dev.tether.rpc.ProtocolException;

import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;

/**
 * The Java frame decoder's fuzz harness: decodes a batch of byte strings (written by tests/test_fuzz.py or
 * scripts/fuzz.py) in one JVM run. Each input is fed to a fresh {@link FrameDecoder} in two pieces (split where
 * its first byte says), and every complete frame is popped. Refusing an input with {@link ProtocolException}
 * (FrameTooLarge included) is correct; any other exception or error (an OutOfMemoryError from an allocation no
 * limit caught, a StackOverflowError from deep nesting, a RuntimeException) is a crash, printed as
 * "CRASH index: what". Prints "N inputs, F frames, R refused, C crashed"; exits 1 on any crash.
 *
 * <pre>java -Xmx256m dev.tether.rpc.tools.FuzzRunner BATCH_FILE</pre>
 * The batch file is a sequence of {@code length:u32 big-endian, bytes}.
 */
public final class FuzzRunner {
    private FuzzRunner() {
    }

    public static void main(String[] args) throws IOException {
        if (args.length != 1) {
            System.err.println("usage: FuzzRunner BATCH_FILE");
            System.exit(2);
        }
        int inputs = 0;
        int frames = 0;
        int refused = 0;
        int crashed = 0;
        InputStream file = new FileInputStream(args[0]);
        try {
            DataInputStream in = new DataInputStream(file);
            while (true) {
                int n;
                try {
                    n = in.readInt();
                } catch (EOFException end) {
                    break;
                }
                byte[] data = new byte[n];
                in.readFully(data);
                try {
                    frames += decodeAll(data);
                } catch (ProtocolException e) {
                    refused++;
                } catch (Throwable e) { // the point of the harness: anything else is a bug
                    crashed++;
                    System.out.println("CRASH " + inputs + ": " + e);
                }
                inputs++;
            }
        } finally {
            file.close();
        }
        System.out.println(inputs + " inputs, " + frames + " frames, " + refused + " refused, " + crashed
                + " crashed");
        System.exit(crashed == 0 ? 0 : 1);
    }

    private static int decodeAll(byte[] data) throws ProtocolException {
        FrameDecoder decoder = new FrameDecoder(Limits.DEFAULT);
        int cut = data.length == 0 ? 0 : (data[0] & 0xff) % (data.length + 1);
        int count = 0;
        decoder.feed(data, 0, cut);
        for (Frame f = decoder.next(); f != null; f = decoder.next()) {
            count++;
        }
        decoder.feed(data, cut, data.length - cut);
        for (Frame f = decoder.next(); f != null; f = decoder.next()) {
            count++;
        }
        return count;
    }
}
