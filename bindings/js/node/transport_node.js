// The node transport: a TCP socket (node:net) behind the small interface protocol.js reads from
// (onData, onClose, write, close, peer). TCP_NODELAY on, as docs/protocol.md asks.
import net from "node:net";

export function wrapSocket(sock) {
  sock.setNoDelay(true);
  const closeCbs = [];
  let closed = false;
  const fireClose = () => { if (!closed) { closed = true; for (const cb of closeCbs) cb(); } };
  sock.on("close", fireClose);
  sock.on("end", () => { fireClose(); sock.destroy(); });
  sock.on("error", () => { fireClose(); });
  return {
    peer: `${sock.remoteAddress}:${sock.remotePort}`,
    onData(cb) { sock.on("data", (b) => cb(new Uint8Array(b.buffer, b.byteOffset, b.byteLength))); },
    onClose(cb) { closeCbs.push(cb); if (closed) cb(); },
    write(bytes) { if (!closed) sock.write(bytes); },
    close() { if (!sock.destroyed) sock.end(() => sock.destroy()); setTimeout(() => sock.destroy(), 2000).unref(); fireClose(); },
  };
}

/** Open a TCP connection; resolves with a transport, rejects after timeoutMs. */
export function connect(host, port, timeoutMs = 5000) {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host, port });
    const timer = setTimeout(() => { sock.destroy(); reject(new Error(`connecting to ${host}:${port} timed out`)); }, timeoutMs);
    sock.once("connect", () => { clearTimeout(timer); sock.removeAllListeners("error"); resolve(wrapSocket(sock)); });
    sock.once("error", (e) => { clearTimeout(timer); reject(e); });
  });
}

/** Listen for connections; onTransport(transport) for each. Resolves with the net.Server once listening. */
export function listen(host, port, onTransport) {
  return new Promise((resolve, reject) => {
    const server = net.createServer((sock) => onTransport(wrapSocket(sock)));
    server.once("error", reject);
    server.listen(port, host, () => resolve(server));
  });
}
