package dev.tether.device;

import java.io.File;
import java.io.IOException;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * The session folder: the only place remote file operations may touch. Names are untrusted: anything but a plain
 * file name is refused with UnsafePathError before the file system is touched (tether_rpc/files.py).
 */
final class SessionFolder {
    static final int MAX_NAME_BYTES = 255;
    private static final Charset UTF8 = Charset.forName("UTF-8");

    final File dir;

    SessionFolder(File dir) throws IOException {
        if (!dir.isDirectory() && !dir.mkdirs()) {
            throw new IOException("cannot create the session folder " + dir);
        }
        this.dir = dir.getCanonicalFile();
    }

    static String safeName(Object name) throws DeviceError {
        if (!(name instanceof String)) {
            throw unsafe("a file name must be a string, got " + (name == null ? "NoneType" : name.getClass().getSimpleName()));
        }
        String n = (String) name;
        if (n.isEmpty()) {
            throw unsafe("a file name must not be empty");
        }
        if (n.indexOf('\0') >= 0) {
            throw unsafe("file name '" + n.replace("\0", "\\x00") + "' contains a NUL byte");
        }
        if (n.equals(".") || n.equals("..")) {
            throw unsafe("file name '" + n + "' is not a file");
        }
        if (n.indexOf('/') >= 0 || n.indexOf('\\') >= 0) {
            throw unsafe("file name '" + n + "' must be a plain name inside the session folder (no directories)");
        }
        for (int i = 0; i < n.length(); i++) {
            if (n.charAt(i) < 32) {
                throw unsafe("file name '" + n + "' contains control characters");
            }
        }
        if (n.getBytes(UTF8).length > MAX_NAME_BYTES) {
            throw unsafe("file name is longer than " + MAX_NAME_BYTES + " bytes");
        }
        return n;
    }

    private static DeviceError unsafe(String message) {
        return new DeviceError("UnsafePathError", message);
    }

    File pathFor(Object name) throws DeviceError, IOException {
        File f = new File(dir, safeName(name));
        // a symlink planted some other way must not lead outside either
        if (!dir.equals(f.getCanonicalFile().getParentFile())) {
            throw unsafe("file name '" + name + "' resolves outside the session folder");
        }
        return f;
    }

    File existing(Object name) throws DeviceError, IOException {
        File f = pathFor(name);
        if (!f.isFile()) {
            List<String> have = list();
            throw new DeviceError("FileNotFoundError", "no file '" + name + "' in the session folder (have: "
                    + (have.isEmpty() ? "nothing" : Text.join(have)) + ")");
        }
        return f;
    }

    List<String> list() {
        List<String> out = new ArrayList<String>();
        File[] files = dir.listFiles();
        if (files != null) {
            for (File f : files) {
                if (f.isFile() && !f.getName().startsWith(".upload-")) {
                    out.add(f.getName());
                }
            }
        }
        Collections.sort(out);
        return out;
    }

    /** Deletes the folder and everything in it (no symlinks are followed: only plain files are made here). */
    static void delete(File dir) {
        File[] files = dir.listFiles();
        if (files != null) {
            for (File f : files) {
                if (f.isDirectory()) {
                    delete(f);
                } else {
                    f.delete();
                }
            }
        }
        dir.delete();
    }
}
