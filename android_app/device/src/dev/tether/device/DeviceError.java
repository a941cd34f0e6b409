package dev.tether.device;

/**
 * An error a call reports to the client: {@link #type} is the ERROR frame's {@code type}, named like the Python
 * server's exception classes ({@code KernelError}, {@code UnsafePathError}, {@code ModuleLoadError},
 * {@code ArchMismatch}, {@code KeyError}, {@code TypeError}, {@code ValueError}, {@code FileNotFoundError},
 * {@code ProtocolError}, ...), so the Python client raises the same exception for both servers.
 */
public final class DeviceError extends Exception {
    private static final long serialVersionUID = 1L;

    public final String type;

    public DeviceError(String type, String message) {
        super(message);
        this.type = type;
    }

    public DeviceError(String type, String message, Throwable cause) {
        super(message, cause);
        this.type = type;
    }
}
