package dev.tether.device;

import java.io.File;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.Charset;

/**
 * What the device needs to know of an ELF file before dlopen: word size, byte order, machine, type, and the
 * bytes of one named section (the module metadata in {@code .tether_meta}); compare tether_rpc/elf.py.
 */
final class ElfInfo {
    static final int EM_X86_64 = 62;
    static final int EM_AARCH64 = 183;
    static final int EM_ARM = 40;
    private static final int ET_DYN = 3;
    private static final int MAX_SECTIONS = 1 << 16;
    private static final int MAX_SECTION_BYTES = 16 << 20;
    private static final Charset UTF8 = Charset.forName("UTF-8");

    final int bits;
    final boolean little;
    final int type;
    final int machine;
    private final RandomAccessFile file;
    private final long shoff;
    private final int shentsize;
    private final int shnum;
    private final int shstrndx;

    private ElfInfo(RandomAccessFile file, String label) throws IOException, DeviceError {
        this.file = file;
        byte[] ident = new byte[64];
        int n = readAt(0, ident);
        if (n < 52 || ident[0] != 0x7f || ident[1] != 'E' || ident[2] != 'L' || ident[3] != 'F') {
            throw new DeviceError("ModuleLoadError", label + " is not an ELF file (no ELF magic): upload a module "
                    + "exported with export_library");
        }
        bits = ident[4] == 2 ? 64 : 32;
        little = ident[5] == 1;
        ByteBuffer h = ByteBuffer.wrap(ident).order(little ? ByteOrder.LITTLE_ENDIAN : ByteOrder.BIG_ENDIAN);
        type = h.getShort(16) & 0xffff;
        machine = h.getShort(18) & 0xffff;
        if (bits == 64) {
            shoff = h.getLong(0x28);
            shentsize = h.getShort(0x3a) & 0xffff;
            shnum = h.getShort(0x3c) & 0xffff;
            shstrndx = h.getShort(0x3e) & 0xffff;
        } else {
            shoff = h.getInt(0x20) & 0xffffffffL;
            shentsize = h.getShort(0x2e) & 0xffff;
            shnum = h.getShort(0x30) & 0xffff;
            shstrndx = h.getShort(0x32) & 0xffff;
        }
    }

    static ElfInfo open(File f, String label) throws IOException, DeviceError {
        RandomAccessFile raf = new RandomAccessFile(f, "r");
        try {
            return new ElfInfo(raf, label);
        } catch (IOException | DeviceError | RuntimeException e) {
            raf.close();
            throw e;
        }
    }

    void close() throws IOException {
        file.close();
    }

    static String archOf(int machine) {
        switch (machine) {
            case EM_X86_64: return "x86_64";
            case EM_AARCH64: return "aarch64";
            case EM_ARM: return "armv7";
            default: return null;
        }
    }

    String machineName() {
        String a = archOf(machine);
        return a != null ? a : "e_machine " + machine;
    }

    boolean isSharedObject() {
        return type == ET_DYN;
    }

    /** This JVM's architecture in tether's names (x86_64, aarch64, armv7). */
    static String hostArch() {
        String a = System.getProperty("os.arch", "").toLowerCase();
        if (a.equals("amd64") || a.equals("x86_64")) {
            return "x86_64";
        }
        if (a.equals("aarch64") || a.equals("arm64")) {
            return "aarch64";
        }
        if (a.startsWith("arm")) {
            return "armv7";
        }
        return a;
    }

    private int readAt(long off, byte[] dst) throws IOException {
        file.seek(off);
        int done = 0;
        while (done < dst.length) {
            int n = file.read(dst, done, dst.length - done);
            if (n < 0) {
                break;
            }
            done += n;
        }
        return done;
    }

    private ByteBuffer sectionHeader(int i) throws IOException, DeviceError {
        byte[] b = new byte[shentsize];
        if (readAt(shoff + (long) i * shentsize, b) != shentsize) {
            throw new DeviceError("ModuleLoadError", "truncated ELF section table");
        }
        return ByteBuffer.wrap(b).order(little ? ByteOrder.LITTLE_ENDIAN : ByteOrder.BIG_ENDIAN);
    }

    private long[] offsetAndSize(ByteBuffer sh) {
        if (bits == 64) {
            return new long[]{sh.getLong(24), sh.getLong(32)};
        }
        return new long[]{sh.getInt(16) & 0xffffffffL, sh.getInt(20) & 0xffffffffL};
    }

    private byte[] read(long[] offSize) throws IOException, DeviceError {
        if (offSize[1] > MAX_SECTION_BYTES || offSize[0] < 0 || offSize[0] + offSize[1] > file.length()) {
            throw new DeviceError("ModuleLoadError", "ELF section of " + offSize[1] + " bytes at " + offSize[0]
                    + " lies outside the file or is too large");
        }
        byte[] b = new byte[(int) offSize[1]];
        readAt(offSize[0], b);
        return b;
    }

    /** The bytes of section {@code name}, or null if there is none. */
    byte[] section(String name) throws IOException, DeviceError {
        if (shoff == 0 || shnum == 0 || shnum > MAX_SECTIONS || shstrndx >= shnum
                || shentsize < (bits == 64 ? 64 : 40)) {
            return null;
        }
        byte[] names = read(offsetAndSize(sectionHeader(shstrndx)));
        byte[] want = name.getBytes(UTF8);
        for (int i = 0; i < shnum; i++) {
            ByteBuffer sh = sectionHeader(i);
            int at = sh.getInt(0);
            if (at < 0 || at + want.length >= names.length) {
                continue;
            }
            boolean same = names[at + want.length] == 0;
            for (int k = 0; same && k < want.length; k++) {
                same = names[at + k] == want[k];
            }
            if (same) {
                return read(offsetAndSize(sh));
            }
        }
        return null;
    }
}
