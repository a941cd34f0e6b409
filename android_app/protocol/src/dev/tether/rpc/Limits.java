package dev.tether.rpc;

/**
 * Upper bounds on what a peer may make us allocate, checked before allocating. The defaults are those of the
 * Python implementation ({@code tether_rpc.protocol.Limits}); a value above a limit is refused, equal is fine.
 */
public final class Limits {
    public final int maxFrame;
    public final long maxBulk;
    public final int maxStr;
    public final int maxBin;
    public final int maxArray;
    public final int maxMap;
    public final int maxExt;
    /** Nesting depth of the payload map (the payload itself is level 1; the frame's outer array is not counted). */
    public final int maxDepth;
    public final int maxNdim;

    public Limits(int maxFrame, long maxBulk, int maxStr, int maxBin, int maxArray, int maxMap, int maxExt,
                  int maxDepth, int maxNdim) {
        this.maxFrame = maxFrame;
        this.maxBulk = maxBulk;
        this.maxStr = maxStr;
        this.maxBin = maxBin;
        this.maxArray = maxArray;
        this.maxMap = maxMap;
        this.maxExt = maxExt;
        this.maxDepth = maxDepth;
        this.maxNdim = maxNdim;
    }

    /** Limits for an established session. */
    public static final Limits DEFAULT = new Limits(16 << 20, 4L << 30, 1 << 20, 16 << 20, 1 << 16, 1 << 12,
            16 << 20, 32, 32);

    /** Tight limits for frames from a peer that has not finished its handshake. */
    public static final Limits HANDSHAKE = new Limits(64 << 10, 0, 4096, 4096, 64, 32, 0, 4, 32);

    @Override
    public String toString() {
        return "Limits(frame=" + maxFrame + ", bulk=" + maxBulk + ", str=" + maxStr + ", bin=" + maxBin + ", array="
                + maxArray + ", map=" + maxMap + ", ext=" + maxExt + ", depth=" + maxDepth + ", ndim=" + maxNdim + ")";
    }
}
