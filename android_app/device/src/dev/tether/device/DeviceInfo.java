package dev.tether.device;

import java.util.LinkedHashMap;
import java.util.Map;

/** Placeholder: device_info lands in a later step. */
final class DeviceInfo {
    private DeviceInfo() {
    }

    static Map<String, Object> collect() {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put("arch", ElfInfo.hostArch());
        return m;
    }
}
