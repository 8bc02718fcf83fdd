// One sandbox: what it is (template, state, times, shape, metadata, network, volumes), and
// while it runs a terminal on it and its files; its CPU and memory charts and its log, live.
import { call } from "./api.js";
import { lineChart, NO_CHARTS, uPlot } from "./charts.js";
import { Agent } from "./envd.js";
import { fileBrowser } from "./files.js";
import { openTerminal } from "./terminal.js";
import { ago, h, left, notice } from "./ui.js";

const LOG_MS = 3000;
const METRICS_MS = 5000;
const MIB = 2 ** 20;

export function render(main, id) {
  const path = `/sandboxes/${encodeURIComponent(id)}`;
  const details = h("dl", { id: "details", class: "details" });
  const termBox = h("div", { id: "terminal", class: "terminal" });
  const files = h("div", {}, h("p", { class: "muted" }, "Files show while it runs."));
  const charts = h("div", { id: "metrics" });
  const log = h("pre", { id: "log", class: "log", tabindex: "0" });
  const plots = new Map();
  const timers = [];
  let close = null;
  let logCursor = null; // unix ms of the last entry shown
  const open = h("button", {
    type: "button", id: "open-terminal",
    onclick: async () => {
      open.disabled = true;
      try {
        close = await openTerminal(termBox, await Agent.of(id), (m) => notice(m, true));
      } catch (e) {
        open.disabled = false;
        if (e.status !== 401) notice(`No terminal: ${e.message}`, true);
      }
    },
  }, "Open a terminal");
  main.append(h("h1", {}, "Sandbox ", h("span", { class: "id" }, id)), details,
              h("h2", {}, "Terminal"), open, termBox, h("h2", {}, "Files"), files,
              h("h2", {}, "CPU and memory"), charts, h("h2", {}, "Log"), log);

  async function describe() {
    let s;
    try {
      ({ data: s } = await call("GET", path));
    } catch (e) {
      if (e.status !== 401) notice(e.message, true);
      return;
    }
    const item = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
    const net = s.network || {};
    details.replaceChildren(
      ...item("Template", s.alias || s.templateID),
      ...item("State", s.state + (s.pauseTier ? ` (${s.pauseTier})` : "")),
      ...item("Started", `${ago(s.startedAt)} ago (${s.startedAt})`),
      ...item("Time left", s.state === "running" ? left(s.endAt) : "—"),
      ...item("On timeout", s.lifecycle ? `${s.lifecycle.onTimeout}`
        + (s.lifecycle.autoResume ? ", resumes on a request" : "") : "—"),
      ...item("Shape", `${s.cpuCount} CPU, ${s.memoryMB} MiB, ${s.diskSizeMB} MiB disk`),
      ...item("Metadata", Object.entries(s.metadata || {}).map(([k, v]) => `${k}=${v}`)
        .join(", ") || "—"),
      ...item("Network", [
        s.allowInternetAccess === false ? "no internet" : "internet",
        net.allowOut && net.allowOut.length ? `allow ${net.allowOut.join(", ")}` : "",
        net.denyOut && net.denyOut.length ? `deny ${net.denyOut.join(", ")}` : "",
        net.egressProxy ? "through an egress proxy" : "",
        net.allowPublicTraffic === false ? "ports need the traffic token" : "",
      ].filter(Boolean).join("; ")),
      ...item("Volumes", (s.volumeMounts || []).map((v) => `${v.name} at ${v.path}`)
        .join(", ") || "—"),
      ...item("Forked from", s.forkedFrom ? lineage(s.forkedFrom) : "—"),
      ...item("Forks", s.forks ? s.forks.flatMap((f, i) => [i ? ", " : "", lineage(f)])
        : "—"));
    if (s.state !== "running") {
      open.disabled = true;
      return;
    }
    files.replaceChildren(fileBrowser(new Agent(id, s.envdAccessToken)));
  }

  // A sandbox of the lineage, as a link to its page (a snapshot, as its id).
  function lineage(ref) {
    return /^[a-z0-9]{20}$/.test(ref)
      ? h("a", { href: `#/sandbox/${ref}`, class: "id" }, ref)
      : h("span", { class: "id" }, `snapshot ${ref}`);
  }

  async function metrics() {
    let rows;
    try {
      ({ data: rows } = await call("GET", `${path}/metrics`));
    } catch {
      return; // a paused or ended sandbox has no new samples: the chart stays
    }
    const UPlot = await uPlot();
    if (!UPlot) {
      charts.replaceChildren(h("p", { class: "muted" }, NO_CHARTS));
      return;
    }
    const points = rows.map((m) => ({ t: m.timestampUnix, cpu: m.cpuUsedPct,
                                      mem: Math.round(m.memUsed / MIB) }));
    lineChart(UPlot, charts, plots, "chart-cpu", "CPU used (%)",
              [{ key: "cpu", label: "CPU %", color: "#2f6fdf" }], points);
    lineChart(UPlot, charts, plots, "chart-mem", "Memory used (MiB)",
              [{ key: "mem", label: "MiB", color: "#c0392b" }], points);
  }

  async function more() {
    const q = new URLSearchParams({ limit: 500, direction: "forward" });
    if (logCursor !== null) q.set("cursor", logCursor + 1);
    let entries;
    try {
      ({ data: { logs: entries } } = await call("GET", `/v2${path}/logs?${q}`));
    } catch {
      return;
    }
    if (!entries.length) return;
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.append(entries.map((e) => `${e.timestamp} ${e.level} ${e.message}`).join("\n") + "\n");
    logCursor = Date.parse(entries[entries.length - 1].timestamp);
    if (atEnd) log.scrollTop = log.scrollHeight;
  }

  describe();
  metrics();
  more();
  timers.push(setInterval(metrics, METRICS_MS), setInterval(more, LOG_MS));
  return () => {
    for (const t of timers) clearInterval(t);
    for (const p of plots.values()) p.destroy();
    if (close) close();
  };
}
