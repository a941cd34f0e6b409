// The browser transport: a WebSocket to the tether web relay (src/tether/web/relay.py), which joins it to one
// TCP connection to the tracker. Binary messages carry the raw bytes of the stream, in order, in any split, so
// the frames and the tracker's token handshake run end to end exactly as over TCP.
const CHUNK = 1 << 20;

export function connect(url, timeoutMs = 5000) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    const closeCbs = [];
    const dataCbs = [];
    const early = [];
    let closed = false;
    const fireClose = () => { if (!closed) { closed = true; for (const cb of closeCbs) cb(); } };
    const timer = setTimeout(() => { ws.close(); reject(new Error(`opening ${url} timed out`)); }, timeoutMs);
    ws.onmessage = (ev) => {
      const bytes = new Uint8Array(ev.data);
      if (dataCbs.length) for (const cb of dataCbs) cb(bytes); else early.push(bytes);
    };
    ws.onclose = () => { clearTimeout(timer); fireClose(); reject(new Error(`${url} closed`)); };
    ws.onerror = () => {};
    ws.onopen = () => {
      clearTimeout(timer);
      resolve({
        peer: url,
        onData(cb) { dataCbs.push(cb); while (early.length) cb(early.shift()); },
        onClose(cb) { closeCbs.push(cb); if (closed) cb(); },
        // at most CHUNK bytes per message: the relay caps messages, and big bulk copies must not sit in one
        write(bytes) {
          if (closed) return;
          for (let pos = 0; pos < bytes.length; pos += CHUNK) ws.send(bytes.subarray(pos, Math.min(bytes.length, pos + CHUNK)));
        },
        close() { ws.close(); fireClose(); },
      });
    };
  });
}
