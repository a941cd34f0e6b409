// The browser device page: reads its settings from the URL fragment (never sent to a server: the token stays in
// the tab), registers this tab with the tracker through the web relay's WebSocket, and shows its state.
// window.tetherDevice exposes {state, detail, sessions, info} for whoever drives the tab (tests, automation).
import { Device } from "../src/device.js";
import { TrackerLink } from "../src/tracker.js";
import { connect } from "../src/transport_ws.js";

const params = new URLSearchParams(location.hash.slice(1));
const key = params.get("key") || "browser";
const tags = {};
for (const t of params.getAll("tag")) {
  const eq = t.indexOf("=");
  if (eq > 0) tags[t.slice(0, eq)] = t.slice(eq + 1);
}
// the fragment held the tokens: take them (only) out of the address bar and history now that they are read
if (params.has("token") || params.has("rpc_token")) {
  const kept = new URLSearchParams(params);
  kept.delete("token");
  kept.delete("rpc_token");
  history.replaceState(null, "", `${location.pathname}${location.search}#${kept}`);
}

const $ = (id) => document.getElementById(id);
const status = { state: "starting", detail: "", sessions: 0, info: null, log: [] };
window.tetherDevice = status;

function show(state, detail = "") {
  status.state = state;
  status.detail = detail;
  $("state").textContent = state;
  $("state").dataset.state = state;
  $("detail").textContent = detail ? `(${detail})` : "";
  const line = `${new Date().toISOString().slice(11, 23)} ${state}${detail ? ": " + detail : ""}`;
  status.log.push(line);
  if (status.log.length > 200) status.log.shift();
  $("log").textContent = status.log.join("\n");
}

$("key").textContent = key;
const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/tracker`;
const device = new Device({
  token: params.get("rpc_token") || null,
  onState: (state, detail) => {
    if (state === "free") status.sessions = device.sessions;
    $("sessions").textContent = String(device.sessions);
    show(state === "free" ? "registered" : state, detail);
  },
});
status.info = device.deviceInfo();
const link = new TrackerLink({ connect: () => connect(wsUrl), key, tags, token: params.get("token") || null, name: key, device,
  onState: (state, detail) => { if (!device.busy) show(state, detail); } });
link.run();
window.addEventListener("pagehide", () => link.stop());
