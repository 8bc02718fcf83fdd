// Sandboxes: the team's running and paused sandboxes, filtered and paged as the API pages
// them, with the actions each state allows. Refreshed every few seconds.
import { call } from "./api.js";
import { actionButton, ago, dialogOpen, h, left, notice, table } from "./ui.js";

const PAGE = 50;
const REFRESH_MS = 5000;
const RESUME_TIMEOUT_S = 300; // a resumed sandbox's time left, as the SDK's default

export function render(main) {
  const filter = { state: "running,paused", template: "", metadata: "" };
  const tokens = [null]; // the page tokens seen: tokens[i] opens page i
  let at = 0;
  let next = null;
  const body = h("div", { id: "sandboxes" });
  const pager = h("div", { class: "row" });
  const stamp = h("p", { class: "muted", id: "stamp" });

  const state = h("select", { id: "f-state" },
    h("option", { value: "running,paused" }, "Running and paused"),
    h("option", { value: "running" }, "Running"),
    h("option", { value: "paused" }, "Paused"));
  const template = h("input", { id: "f-template", placeholder: "template or alias", size: 16 });
  const metadata = h("input", { id: "f-metadata", placeholder: "key=value", size: 16 });
  const form = h("form", {
    class: "row",
    onsubmit: (ev) => {
      ev.preventDefault();
      Object.assign(filter, { state: state.value, template: template.value.trim(),
                              metadata: metadata.value.trim() });
      tokens.length = 1;
      at = 0;
      load();
    },
  }, h("label", { for: "f-state" }, "State", state),
  h("label", { for: "f-template" }, "Template", template),
  h("label", { for: "f-metadata" }, "Metadata", metadata),
  h("button", { type: "submit" }, "Filter"));

  main.append(h("h1", {}, "Sandboxes"), form, stamp, body, pager);

  async function load() {
    const q = new URLSearchParams({ limit: PAGE });
    for (const s of filter.state.split(",")) q.append("state", s);
    if (filter.template) q.set("template", filter.template);
    if (filter.metadata) q.set("metadata", filter.metadata);
    if (tokens[at]) q.set("nextToken", tokens[at]);
    let page;
    try {
      page = await call("GET", `/v2/sandboxes?${q}`);
    } catch (e) {
      if (e.status !== 401) {
        notice(e.message, true);
        stamp.textContent = e.status === 0 ? "Unreachable: the list below is as last seen."
          : stamp.textContent;
      }
      return;
    }
    next = page.next;
    const running = page.data.filter((x) => x.state === "running").map((x) => x.sandboxID);
    let live = {};
    if (running.length) {
      try {
        const q = new URLSearchParams({ sandbox_ids: running.join(",") });
        ({ data: { sandboxes: live } } = await call("GET", `/sandboxes/metrics?${q}`));
      } catch { /* the figures wait for the next refresh */ }
    }
    const focused = document.activeElement && document.activeElement.dataset.focusKey;
    body.replaceChildren(page.data.length ? table(
      ["ID", "Template", "State", "Started", "Time left", "CPU", "Memory", "Actions"],
      page.data.map((x) => row(x, live[x.sandboxID]))) : h("p", { class: "muted" }, "No sandboxes."));
    if (focused) body.querySelector(`[data-focus-key="${CSS.escape(focused)}"]`)?.focus();
    pager.replaceChildren(
      h("button", { type: "button", disabled: at === 0, onclick: () => { at -= 1; load(); } },
        "Previous page"),
      h("button", { type: "button", disabled: !next, onclick: () => {
        tokens[at + 1] = next;
        at += 1;
        load();
      } }, "Next page"));
    stamp.textContent = `As of ${new Date().toLocaleTimeString()}.`;
    if (document.getElementById("notice").classList.contains("error")
        && document.getElementById("notice").textContent.includes("unreachable")) notice("");
  }

  // `m`: its latest metrics sample, if it runs.
  function row(s, m) {
    const name = s.alias || s.templateID;
    const tier = s.state === "paused" && s.pauseTier ? ` (${s.pauseTier})` : "";
    return h("tr", { "data-sandbox": s.sandboxID },
      h("td", { class: "id" }, h("a", { href: `#/sandbox/${s.sandboxID}` }, s.sandboxID)),
      h("td", {}, name),
      h("td", { class: "state" }, s.state + tier),
      h("td", { title: s.startedAt }, ago(s.startedAt)),
      h("td", { title: s.endAt }, s.state === "running" ? left(s.endAt) : "—"),
      h("td", { class: "cpu" }, m ? `${m.cpuUsedPct.toFixed(0)}% of ${s.cpuCount}`
        : `${s.cpuCount}`),
      h("td", { class: "mem" }, m ? `${Math.round(m.memUsed / 2 ** 20)} of ${s.memoryMB} MiB`
        : `${s.memoryMB} MiB`),
      h("td", { class: "actions" }, actions(s)));
  }

  function actions(s) {
    const id = s.sandboxID;
    const path = `/sandboxes/${encodeURIComponent(id)}`;
    const out = [];
    if (s.state === "running") {
      out.push(action(id, "Pause", `Pause ${id}? Its memory and files are kept.`, async () => {
        await call("POST", `${path}/pause`);
        return `Paused ${id}.`;
      }));
    } else {
      out.push(action(id, "Resume", `Resume ${id}?`, async () => {
        await call("POST", `${path}/connect`, { timeout: RESUME_TIMEOUT_S });
        return `Resumed ${id}.`;
      }));
    }
    out.push(action(id, "Fork", `Fork ${id} into independent copies of its state now?`,
      async (count) => {
        const { data } = await call("POST", `${path}/fork`, { count: Number(count) });
        const made = data.filter((r) => r.sandbox).map((r) => r.sandbox.sandboxID);
        const failed = data.filter((r) => r.error).map((r) => r.error.message);
        return `Forked ${id} into ${made.join(", ") || "nothing"}.`
          + (failed.length ? ` Refused: ${failed.join("; ")}` : "");
      }, { label: "Copies (1-20)", type: "number", value: "1" }));
    if (s.state === "running") {
      out.push(action(id, "Snapshot", `Snapshot ${id}? It keeps running.`, async (name) => {
        const { data } = await call("POST", `${path}/snapshots`, name ? { name } : {});
        return `Snapshot ${data.snapshotID} of ${id}.`;
      }, { label: "Name (optional)", value: "" }));
      out.push(action(id, "Timeout", `Set ${id}'s time left from now?`, async (secs) => {
        await call("POST", `${path}/timeout`, { timeout: Number(secs) });
        return `${id} now ends in ${secs} s.`;
      }, { label: "Seconds", type: "number", value: "300" }));
    }
    out.push(action(id, "Kill", `Kill ${id}? Its memory and files are lost.`, async () => {
      await call("DELETE", path);
      return `Killed ${id}.`;
    }));
    return out;
  }

  function action(id, label, question, run, field = null) {
    return actionButton({ label, what: id, question, run, field, after: load,
                          attrs: { "data-focus-key": `${label}:${id}` } });
  }

  load();
  const timer = setInterval(() => { if (!dialogOpen()) load(); }, REFRESH_MS);
  return () => clearInterval(timer);
}
