package dev.tether.device;

import java.util.Map;

/** Placeholder until the CPU-feature check lands. */
final class CpuFeatures {
    private CpuFeatures() {
    }

    static void checkModule(Map<String, Object> meta, String label) throws DeviceError {
    }
}
