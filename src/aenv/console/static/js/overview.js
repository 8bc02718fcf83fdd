// Overview: the team's sandboxes and memory against its limits, now and over the last hour
// (GET /overview, from the node's ring buffer); for an admin key the node's too: capacity,
// create and fork rates, memory held. Charts by uPlot; refreshed as the node samples.
import { call } from "./api.js";
import { lineChart, NO_CHARTS, uPlot } from "./charts.js";
import { h, notice } from "./ui.js";

const MIN_REFRESH_MS = 5000;

export function render(main) {
  const cards = h("div", { id: "cards", class: "cards" });
  const charts = h("div", { id: "charts" });
  main.append(h("h1", {}, "Overview"), cards, charts);
  const plots = new Map(); // chart id -> uPlot
  let timer = null;
  let gone = false;

  function card(id, title, value, detail) {
    return h("div", { class: "card", id }, h("div", { class: "muted" }, title),
             h("div", { class: "figure" }, value), h("div", { class: "muted" }, detail));
  }

  function of(n, max) {
    return max === null || max === undefined ? `${n}` : `${n} of ${max}`;
  }

  const chart = (UPlot, id, title, series, rows) =>
    lineChart(UPlot, charts, plots, id, title, series, rows);

  async function load() {
    let o;
    try {
      ({ data: o } = await call("GET", "/overview"));
    } catch (e) {
      if (e.status !== 401) notice(e.message, true);
      schedule(MIN_REFRESH_MS);
      return;
    }
    const t = o.team;
    const list = [
      card("c-running", `Running (${t.name})`, of(t.now.running, t.maxSandboxes), "sandboxes"),
      card("c-paused", "Paused", `${t.now.paused}`, `${t.now.hot} hot, ${t.now.cold} cold`),
      card("c-memory", "Guest memory", of(t.now.memoryMB, t.maxMemoryMB), "MiB"),
    ];
    if (o.node) {
      const last = o.node.history[o.node.history.length - 1];
      list.push(
        card("c-node", "Node", of(o.node.now.running, o.node.maxSandboxes),
             `running; ${o.node.now.paused} paused`),
        card("c-held", "Memory held", last ? `${last.heldMiB}` : "—", "MiB of the host's"),
        card("c-rates", "Per minute", last ? `${last.createsPerMin}` : "—",
             `creates; ${last ? last.forksPerMin : "—"} forks`));
    }
    cards.replaceChildren(...list);
    const UPlot = await uPlot();
    if (gone) return;
    if (!UPlot) {
      charts.replaceChildren(h("p", { class: "muted" }, NO_CHARTS));
    } else {
      chart(UPlot, "chart-team", "The team's sandboxes, last hour", [
        { key: "running", label: "running", color: "#2f6fdf" },
        { key: "paused", label: "paused", color: "#c08a2b" }], t.history);
      if (o.node) {
        chart(UPlot, "chart-node", "The node: creates and forks per minute", [
          { key: "createsPerMin", label: "creates/min", color: "#2f9f5f" },
          { key: "forksPerMin", label: "forks/min", color: "#8a4fdf" }], o.node.history);
        chart(UPlot, "chart-held", "The node: memory held (MiB)", [
          { key: "heldMiB", label: "MiB held", color: "#c0392b" }], o.node.history);
      }
    }
    schedule(Math.max(MIN_REFRESH_MS, o.sampleEveryS * 1000));
  }

  function schedule(ms) {
    if (!gone) timer = setTimeout(load, ms);
  }

  load();
  return () => {
    gone = true;
    clearTimeout(timer);
    for (const p of plots.values()) p.destroy();
  };
}
