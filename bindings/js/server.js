#!/usr/bin/env node
// The node device server: registers with a tether tracker in reverse mode (it dials out; the tracker relays
// sessions to it) and/or listens on 127.0.0.1 for direct `tether.rpc.connect` sessions.
//
//   node bindings/js/server.js --tracker HOST:PORT --key node [--tracker-token T] [--tag k=v ...]
//                              [--port P] [--token T] [--session-memory BYTES] [--session-disk BYTES]
//
// Tokens may also come from TETHER_TRACKER_TOKEN and TETHER_TOKEN. The direct listener binds 127.0.0.1 only.
import { Device } from "./src/device.js";
import { TrackerLink } from "./src/tracker.js";
import { connect, listen } from "./node/transport_node.js";

const USAGE = "usage: node bindings/js/server.js [--tracker HOST:PORT --key KEY [--tracker-token T] [--tag k=v ...]] [--port P] [--token T]";

function fail(message) {
  process.stderr.write(`server.js: ${message}\n${USAGE}\n`);
  process.exit(2);
}

function parseSize(text, what) {
  const m = /^(\d+)\s*(|B|KB|MB|GB|KiB|MiB|GiB)$/i.exec(String(text));
  if (!m) fail(`${what} takes a size like 512MiB or 1GB, got ${JSON.stringify(text)}`);
  const unit = { "": 1, b: 1, kb: 1e3, mb: 1e6, gb: 1e9, kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30 }[m[2].toLowerCase()];
  return Number(m[1]) * unit;
}

function parseArgs(argv) {
  const o = { tags: {}, tracker: null, key: null, port: null, token: process.env.TETHER_TOKEN || null,
    trackerToken: process.env.TETHER_TRACKER_TOKEN || null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => { if (i + 1 >= argv.length) fail(`${a} needs a value`); return argv[++i]; };
    switch (a) {
      case "--tracker": {
        const v = value();
        const m = /^(.+):(\d+)$/.exec(v);
        if (!m) fail(`--tracker takes HOST:PORT, got ${JSON.stringify(v)}`);
        o.tracker = { host: m[1], port: Number(m[2]) };
        break;
      }
      case "--key": o.key = value(); break;
      case "--tracker-token": o.trackerToken = value(); break;
      case "--token": o.token = value(); break;
      case "--tag": {
        const v = value();
        const eq = v.indexOf("=");
        if (eq <= 0) fail(`--tag takes name=value, got ${JSON.stringify(v)}`);
        o.tags[v.slice(0, eq)] = v.slice(eq + 1);
        break;
      }
      case "--port": {
        const v = value();
        if (!/^\d+$/.test(v) || Number(v) > 65535) fail(`--port takes a TCP port, got ${JSON.stringify(v)}`);
        o.port = Number(v);
        break;
      }
      case "--session-memory": o.memoryBytes = parseSize(value(), a); break;
      case "--session-disk": o.diskBytes = parseSize(value(), a); break;
      case "-h": case "--help": process.stdout.write(USAGE + "\n"); process.exit(0); break;
      default: fail(`unknown option ${JSON.stringify(a)}`);
    }
  }
  if (o.tracker && !o.key) fail("--tracker needs --key (the name clients request the device by)");
  if (!o.tracker && o.port === null) fail("give --tracker HOST:PORT --key KEY, or --port P, or both");
  return o;
}

const log = (line) => process.stderr.write(`[tether-js] ${line}\n`);

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const device = new Device({ token: o.token, memoryBytes: o.memoryBytes, diskBytes: o.diskBytes,
    onState: (state, detail) => log(`device ${state}${detail ? ": " + detail : ""}`) });
  if (o.port !== null) {
    const server = await listen("127.0.0.1", o.port, (t) => { device.serve(t).catch((e) => log(`session error: ${e?.stack ?? e}`)); });
    // the first line on stdout says where we listen (tests and scripts read it)
    process.stdout.write(`listening on 127.0.0.1:${server.address().port}\n`);
  }
  if (o.tracker) {
    const link = new TrackerLink({
      connect: () => connect(o.tracker.host, o.tracker.port),
      key: o.key, tags: o.tags, token: o.trackerToken, device,
      onState: (state, detail) => {
        log(`tracker ${state}${detail ? ": " + detail : ""}`);
        if (state === "registered" && link.registrations === 1) process.stdout.write(`registered with ${o.tracker.host}:${o.tracker.port} as ${o.key}\n`);
      },
    });
    link.run();
  }
  const stop = () => process.exit(0);
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((e) => { log(e?.stack ?? String(e)); process.exit(1); });
