// The Tianji console: topology, live status and the reachability analyzer, over the same REST API as the CLI.
// No framework and no outside file: clusters are often air-gapped. Every name a tenant typed is put in the page as
// text (textContent, SVG text nodes), never as markup.

const NS = "http://www.w3.org/2000/svg";
const state = { token: sessionStorage.getItem("tianjiToken"), who: null, data: null, statusTimer: null };

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) e.setAttribute(k, v);
  for (const k of kids.flat()) e.append(k instanceof Node ? k : document.createTextNode(String(k ?? "")));
  return e;
}

function svg(tag, attrs = {}, ...kids) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) e.setAttribute(k, v);
  for (const k of kids.flat()) e.append(k instanceof Node ? k : document.createTextNode(String(k ?? "")));
  return e;
}

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path, options = {}) {
  const r = await fetch(path, { ...options, headers: { "Authorization": `Bearer ${state.token}`,
                                                       "Content-Type": "application/json", ...(options.headers || {}) } });
  if (r.status === 401) { signOut("the token was refused: sign in again"); throw new ApiError(401, "unauthorized"); }
  const body = r.status === 204 ? null : await r.json();
  if (!r.ok) throw new ApiError(r.status, inWords(body, r.statusText));
  return { body, next: r.headers.get("x-next-marker") };
}

function inWords(body, fallback) {  // a refusal as a person says it: the field, then what is wrong with it
  let said = body && body.detail ? String(body.detail) : fallback;
  for (const noise of ["body: ", "Value error, "]) if (said.startsWith(noise)) said = said.slice(noise.length);
  said = said.replaceAll("Value error, ", "");
  return said;
}

async function all(path) {  // every page of a list
  const out = [];
  let marker = null;
  for (;;) {
    const sep = path.includes("?") ? "&" : "?";
    const { body, next } = await api(`${path}${sep}limit=500${marker ? `&marker=${encodeURIComponent(marker)}` : ""}`);
    out.push(...body);
    if (!next) return out;
    marker = next;
  }
}

async function maybe(path) {  // a list the caller may not be allowed to see: empty then
  try { return await all(path); } catch (e) { if (e.status === 403 || e.status === 404) return []; throw e; }
}

// --- sign in --------------------------------------------------------------------------------------------------

function signOut(message = "") {
  sessionStorage.removeItem("tianjiToken");
  state.token = null;
  document.querySelector("main").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  document.getElementById("login-error").textContent = message;
}

async function signIn(token) {
  state.token = token;
  try {
    state.who = (await api("/v1/whoami")).body;
  } catch (e) {
    if (e.status !== 401) signOut(`the controller did not answer: ${e.message}`);
    return;
  }
  sessionStorage.setItem("tianjiToken", token);
  document.getElementById("login").hidden = true;
  document.querySelector("main").hidden = false;
  document.getElementById("logout").hidden = false;
  document.getElementById("who").textContent = `${state.who.kind}${state.who.name ? `: ${state.who.name}` : ""}`;
  await showView("topology");
}

// --- views ----------------------------------------------------------------------------------------------------

async function showView(name) {
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== name;
  for (const t of document.querySelectorAll("button.tab")) t.classList.toggle("active", t.dataset.view === name);
  clearInterval(state.statusTimer);
  if (name === "topology") await loadTopology();
  if (name === "status") { await loadStatus(); state.statusTimer = setInterval(loadStatus, 5000); }
  if (name === "reachability") await fillReachability();
  if (name === "api") {
    const frame = document.getElementById("api-frame");
    if (!frame.getAttribute("src")) frame.setAttribute("src", "/docs");
  }
}

async function loadData() {
  const admin = state.who.kind === "admin";
  const [vpcs, subnets, ports, peerings, nats, lbs, lines, endpoints, tenants] = await Promise.all([
    all("/v1/vpcs"), all("/v1/subnets"), all("/v1/ports"), all("/v1/peerings"), maybe("/v1/nat-gateways"),
    maybe("/v1/load-balancers"), maybe("/v1/private-lines"), maybe("/v1/service-endpoints"),
    admin ? maybe("/v1/tenants") : []]);
  const tenantName = new Map(tenants.map(t => [t.id, t.name]));
  state.data = { vpcs, subnets, ports, peerings, nats, lbs, lines, endpoints, tenantName };
  return state.data;
}

// --- topology: VPCs as columns, their subnets and ports inside, peerings as arcs, gateways as badges -------------

const COL_W = 300, GAP = 60, TOP = 120, ROW = 18, MAX_ROWS = 14;

function badgesOf(d, vpc) {
  const out = [];
  for (const g of d.nats.filter(x => x.vpc_id === vpc.id)) out.push(["nat", `NAT ${g.name}`]);
  for (const lb of d.lbs.filter(x => x.vpc_id === vpc.id)) out.push(["lb", `LB ${lb.name} ${lb.vip_address || ""}`]);
  for (const l of d.lines.filter(x => x.vpc_id === vpc.id)) out.push(["line", `line ${l.name} VLAN ${l.vlan_id}`]);
  for (const e of d.endpoints.filter(x => x.vpc_id === vpc.id)) out.push(["endpoint", `service ${e.service_name}`]);
  return out;
}

function drawVpc(d, vpc, x, top) {
  const g = svg("g", { class: "vpc", "data-vpc-id": vpc.id, "data-name": vpc.name });
  let y = top + 46;
  const body = [];
  const badges = badgesOf(d, vpc);
  badges.forEach(([kind, label], i) => {
    const bx = x + 10 + (i % 2) * 140, by = y + Math.floor(i / 2) * 24;
    body.push(svg("g", { class: `badge ${kind}` }, svg("rect", { x: bx, y: by, width: 132, height: 20, rx: 10 }),
                  svg("text", { x: bx + 8, y: by + 14, "font-size": 11 }, label.slice(0, 22))));
  });
  y += Math.ceil(badges.length / 2) * 24 + (badges.length ? 6 : 0);
  for (const sn of d.subnets.filter(s => s.vpc_id === vpc.id)) {
    const ports = d.ports.filter(p => p.subnet_id === sn.id);
    const shown = ports.slice(0, MAX_ROWS);
    const h = 30 + shown.length * ROW + (ports.length > shown.length ? ROW : 0) + 6;
    const sg = svg("g", { class: "subnet", "data-subnet-id": sn.id, "data-name": sn.name },
                   svg("rect", { class: "subnet-box", x: x + 10, y, width: COL_W - 20, height: h, rx: 6 }),
                   svg("text", { x: x + 20, y: y + 18, "font-size": 12, "font-weight": 600 }, `${sn.name}  ${sn.cidr}${sn.ipv6_cidr ? `  ${sn.ipv6_cidr}` : ""}`));
    shown.forEach((p, i) => {
      const py = y + 34 + i * ROW;
      const port = svg("g", { class: `port ${p.status === "UP" ? "up" : "down"}`, "data-port-id": p.id,
                              tabindex: 0 },
                       svg("title", {}, `${p.name} ${p.ip}${p.ipv6 ? ` ${p.ipv6}` : ""} on ${p.host || "no host"} (${p.status})`),
                       svg("circle", { cx: x + 28, cy: py - 4, r: 5 }),
                       svg("text", { x: x + 40, y: py, "font-size": 11 },
                           `${p.name.slice(0, 16)}  ${p.ip}  ${p.host ? `@${p.host}` : "(unbound)"}`));
      port.addEventListener("click", () => pickSource(p.id));
      sg.append(port);
    });
    if (ports.length > shown.length) {
      sg.append(svg("text", { x: x + 40, y: y + 34 + shown.length * ROW, "font-size": 11, fill: "#6b7385" },
                    `+ ${ports.length - shown.length} more ports`));
    }
    body.push(sg);
    y += h + 8;
  }
  if (!d.subnets.some(s => s.vpc_id === vpc.id)) {
    body.push(svg("text", { class: "empty", x: x + 14, y: y + 14, "font-size": 11, fill: "#6b7385" },
                  "no subnets: create one with"),
              svg("text", { class: "empty", x: x + 14, y: y + 30, "font-size": 11, fill: "#6b7385",
                            "font-family": "ui-monospace, monospace" },
                  `tianji subnet create NAME --vpc ${vpc.name.slice(0, 12)} --cidr ...`));
    y += 40;
  }
  const height = Math.max(y - top + 4, 80);
  g.append(svg("rect", { class: "vpc-box", x, y: top, width: COL_W, height, rx: 10 }),
           svg("text", { x: x + 12, y: top + 20, "font-size": 15, "font-weight": 700 }, vpc.name),
           svg("text", { x: x + 12, y: top + 37, "font-size": 11, fill: "#6b7385" },
               `${vpc.cidr}${vpc.ipv6_cidr ? `  ${vpc.ipv6_cidr}` : ""}  VNI ${vpc.vni}${state.who.kind === "admin" ?
                 `  tenant ${d.tenantName.get(vpc.tenant_id) || vpc.tenant_id.slice(0, 8)}` : ""}`),
           ...body);
  return { g, height };
}

function drawTopology(d) {
  // VPCs in rows as wide as the canvas (at 1366x768 every VPC is on the page: rows wrap, the canvas scrolls down)
  const canvas = document.getElementById("topology-canvas");
  canvas.replaceChildren();
  if (!d.vpcs.length) {
    canvas.append(el("div", { class: "empty-state", id: "topology-empty" },
      el("p", {}, "No VPCs yet. Create one:"),
      el("pre", {}, "tianji vpc create prod --cidr 10.0.0.0/16\ntianji subnet create web --vpc prod --cidr 10.0.1.0/24"),
      el("p", {}, "or POST /v1/vpcs (the API tab); then Refresh.")));
    document.getElementById("topology-summary").textContent = "0 VPCs";
    return;
  }
  const perRow = Math.max(1, Math.floor((canvas.clientWidth - GAP / 2) / (COL_W + GAP)));
  const ids = d.vpcs.map(v => v.id);
  const ghosts = [];  // the other side of a peering with another tenant's VPC (not visible here)
  for (const pc of d.peerings) for (const vid of [pc.requester_vpc_id, pc.accepter_vpc_id]) {
    if (!ids.includes(vid)) { ids.push(vid); ghosts.push(vid); }
  }
  const pos = new Map();  // VPC id -> {x, top}
  const drawn = [];
  let top = TOP, rowHeight = 0;
  ids.forEach((vid, i) => {
    if (i > 0 && i % perRow === 0) { top += rowHeight + TOP - 40; rowHeight = 0; }
    const x = GAP / 2 + (i % perRow) * (COL_W + GAP);
    pos.set(vid, { x, top });
    const vpc = d.vpcs.find(v => v.id === vid);
    const h = vpc ? drawVpc(d, vpc, x, top) : { g: null, height: 60 };
    if (vpc) drawn.push(h);
    rowHeight = Math.max(rowHeight, h.height);
  });
  const height = top + Math.max(200, rowHeight) + 30;
  const width = Math.max(600, Math.min(ids.length, perRow) * (COL_W + GAP));
  const root = svg("svg", { id: "topology-svg", width, height, viewBox: `0 0 ${width} ${height}` });
  root.append(svg("text", { x: 16, y: 24, "font-size": 13, fill: "#6b7385" },
                  "VPCs with their subnets and ports (blue: up, grey: down or unbound); arcs are peerings " +
                  "(dashed: awaiting acceptance). Click a port to ask what it can reach."));
  for (const vid of ghosts) {
    const { x, top: gy } = pos.get(vid);
    root.append(svg("g", { class: "vpc ghost-vpc", "data-vpc-id": vid },
                    svg("rect", { class: "ghost", x, y: gy, width: COL_W, height: 60, rx: 10 }),
                    svg("text", { x: x + 12, y: gy + 34, "font-size": 12, fill: "#8a6fb5" }, "another tenant's VPC")));
  }
  for (const x of drawn) root.append(x.g);
  for (const pc of d.peerings) {
    const [a, b] = [pos.get(pc.requester_vpc_id), pos.get(pc.accepter_vpc_id)].sort((p, q) => p.x - q.x);
    const x1 = a.x + COL_W * 0.7, x2 = b.x + COL_W * 0.3, peak = Math.min(a.top, b.top);
    const lift = Math.min(TOP - 50, 30 + Math.abs(b.x - a.x) / 10);
    root.append(svg("path", { class: `peering ${pc.status}`, "data-peering-id": pc.id, "data-status": pc.status,
                              d: `M ${x1} ${a.top} C ${x1} ${peak - lift}, ${x2} ${peak - lift}, ${x2} ${b.top}` },
                    svg("title", {}, `peering ${pc.status}`)));
  }
  canvas.append(root);
  const bound = d.ports.filter(p => p.host).length;
  document.getElementById("topology-summary").textContent =
    `${d.vpcs.length} VPCs, ${d.subnets.length} subnets, ${d.ports.length} ports (${bound} bound), ` +
    `${d.peerings.length} peerings`;
}

async function loadTopology() {
  drawTopology(await loadData());
}

// --- status -----------------------------------------------------------------------------------------------------

function cell(text, cls) { return el("td", cls ? { class: cls } : {}, text ?? ""); }

async function loadStatus() {
  const health = (await api("/healthz")).body;
  const admin = state.who.kind === "admin";  // hosts are the operator's: a tenant is not shown them
  const [hosts, pools, lines, lbs] = await Promise.all([admin ? maybe("/v1/hosts") : [], maybe("/v1/pools"),
                                                        maybe("/v1/private-lines"), maybe("/v1/load-balancers")]);
  const now = Date.now() / 1000;
  document.getElementById("status-summary").textContent =
    `controller: ${health.status}${health.revision !== undefined ? `, revision ${health.revision}` : ""}` +
    `${health.role ? `, ${health.role}` : ""}; ${admin ? `${hosts.length} hosts` : "hosts: the admin's view"}`;
  document.getElementById("operator-hosts").hidden = !admin;
  document.getElementById("my-ports").hidden = admin;
  if (!admin) await showOwnPorts(now);
  document.querySelector("#hosts-table tbody").replaceChildren(...hosts.map(h => el("tr", { "data-host": h.name },
    cell(h.name), cell(h.kind), cell(h.role || ""), cell(h.status, `st-${h.status}`), cell(h.vtep_ip), cell(h.ports),
    cell(h.revision_applied ?? "-"),
    cell(health.revision !== undefined && h.revision_applied != null ? Math.max(0, health.revision - h.revision_applied) : "-"),
    cell(h.agent_errors ?? "-", h.agent_errors ? "st-ERROR" : ""), cell(h.last_seen.replace("T", " ").slice(0, 19)))));
  const lbName = new Map(lbs.map(l => [l.id, l.name]));
  const memberRows = [];
  for (const pool of pools) {
    for (const m of await maybe(`/v1/pools/${pool.id}/members`)) {
      const since = m.status_changed_at ? `${Math.round(now - Date.parse(m.status_changed_at) / 1000)} s` : "";
      memberRows.push(el("tr", {}, cell(lbName.get(pool.load_balancer_id) || pool.load_balancer_id), cell(pool.name),
                         cell(`${m.address}:${m.protocol_port}`), cell(m.port_id.slice(0, 8)),
                         cell(m.operating_status, `st-${m.operating_status}`), cell(since)));
    }
  }
  document.querySelector("#members-table tbody").replaceChildren(...memberRows);
  document.querySelector("#sessions-table tbody").replaceChildren(...lines.flatMap(l => (l.sessions || []).map(s =>
    el("tr", {}, cell(l.name), cell(s.instance || "(none)"), cell(s.local_ip), cell(s.customer_ip),
       cell(s.bgp_state, `st-${s.bgp_state}`), cell(s.bfd_state), cell(s.accepted), cell(s.last_error || "")))));
}

async function showOwnPorts(now) {  // a tenant's status: its ports, up or down, where, and since when
  const [ports, vpcs, subnets] = await Promise.all([all("/v1/ports"), all("/v1/vpcs"), all("/v1/subnets")]);
  const vpcName = new Map(vpcs.map(v => [v.id, v.name])), subnetName = new Map(subnets.map(s => [s.id, s.name]));
  const since = t => t ? `${Math.max(0, Math.round(now - Date.parse(t) / 1000))} s ago` : "-";
  document.querySelector("#ports-table tbody").replaceChildren(...ports.map(p => el("tr", { "data-port": p.name },
    cell(p.name), cell(p.ipv6 ? `${p.ip}  ${p.ipv6}` : p.ip), cell(vpcName.get(p.vpc_id) || p.vpc_id), cell(subnetName.get(p.subnet_id) || ""),
    cell(p.host || "(unbound)"), cell(p.status, `st-${p.status === "UP" ? "up" : "down"}`),
    cell(since(p.status_changed_at)))));
  document.getElementById("ports-empty").hidden = ports.length > 0;
}

// --- reachability ------------------------------------------------------------------------------------------------

async function fillReachability() {
  const d = state.data || await loadData();
  const src = document.getElementById("reach-source");
  const keep = src.value;
  src.replaceChildren(...d.ports.filter(p => p.host).map(p => el("option", { value: p.id }, `${p.name}  ${p.ip}`)));
  if (keep) src.value = keep;
  document.getElementById("reach-ips").replaceChildren(
    ...d.ports.map(p => el("option", { value: p.name }, p.ip)), ...d.ports.map(p => el("option", { value: p.ip }, p.name)));
}

async function pickSource(portId) {
  await showView("reachability");
  document.getElementById("reach-source").value = portId;
  document.getElementById("reach-result").replaceChildren();  // the last answer was another port's
}

function destination(text) {  // an address, or a port the caller sees, by name
  if (/^\d{1,3}(\.\d{1,3}){3}$/.test(text)) return { ip: text };
  const named = (state.data ? state.data.ports : []).filter(p => p.name === text);
  if (named.length === 1) return { port_id: named[0].id };
  throw new Error(named.length ? `${named.length} ports are named ${text}: give an address` :
                  `no port named ${text}, and not an IP address`);
}

function renderLeg(title, leg) {
  return el("div", { class: "leg" }, el("h4", {}, `${title}: ${leg.end}`),
    ...leg.hops.map(h => el("div", { class: "hop", "data-host": h.host },
      el("div", { class: "where" }, `${h.host} (${h.kind}${h.role ? ` ${h.role}` : ""}${h.vni != null ? `, VNI ${h.vni}` : ""})`),
      el("ol", {}, ...h.steps.map(s => el("li", { class: s.does.endsWith(": dropped") ? "dropped" : "" },
                                          el("span", { class: "table" }, s.table), s.does))))));
}

async function analyze(ev) {
  ev.preventDefault();
  const proto = document.getElementById("reach-proto").value;
  const out = document.getElementById("reach-result");
  let dest;
  try { dest = destination(document.getElementById("reach-dest").value.trim()); } catch (e) {
    out.replaceChildren(el("p", { class: "error" }, e.message));
    return;
  }
  const body = { source_port_id: document.getElementById("reach-source").value, destination: dest, protocol: proto };
  if (proto !== "icmp") body.port = Number(document.getElementById("reach-port").value);
  out.replaceChildren(el("p", {}, "analyzing..."));
  try {
    const a = (await api("/v1/reachability", { method: "POST", body: JSON.stringify(body) })).body;
    out.replaceChildren(el("div", { class: `verdict ${a.verdict}`, id: "verdict" }, a.verdict.toUpperCase()),
                        el("p", { id: "reason" }, a.reason), renderLeg("request", a.forward),
                        ...(a.reply ? [renderLeg("reply", a.reply)] : []));
  } catch (e) {  // said against the form's own labels
    out.replaceChildren(el("p", { class: "error" }, e.message.replace(/^destination(\.\w+)?: /, "To: ")
                                                             .replace(/^source_port_id: /, "From port: ")));
  }
}

// --- wiring -----------------------------------------------------------------------------------------------------

document.getElementById("login-form").addEventListener("submit", ev => {
  ev.preventDefault();
  signIn(document.getElementById("token").value.trim());
});
document.getElementById("logout").addEventListener("click", () => signOut());
document.getElementById("refresh-topology").addEventListener("click", loadTopology);
document.getElementById("reach-form").addEventListener("submit", analyze);
document.getElementById("reach-proto").addEventListener("change", ev => {
  document.getElementById("reach-port").disabled = ev.target.value === "icmp";
});
for (const t of document.querySelectorAll("button.tab")) t.addEventListener("click", () => showView(t.dataset.view));
let resizing = null;
window.addEventListener("resize", () => {  // the rows follow the window's width
  clearTimeout(resizing);
  resizing = setTimeout(() => { if (state.data && !document.getElementById("topology").hidden) drawTopology(state.data); }, 150);
});
if (state.token) signIn(state.token); else signOut();
