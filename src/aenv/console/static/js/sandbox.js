// One sandbox: what it is (template, state, times, shape, metadata, lineage) and, while it
// runs, a terminal on it and its files.
import { call } from "./api.js";
import { Agent } from "./envd.js";
import { fileBrowser } from "./files.js";
import { openTerminal } from "./terminal.js";
import { ago, h, left, notice } from "./ui.js";

export function render(main, id) {
  const details = h("dl", { id: "details", class: "details" });
  const termBox = h("div", { id: "terminal", class: "terminal" });
  let close = null;
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
  const files = h("div", {}, h("p", { class: "muted" }, "Files show while it runs."));
  main.append(h("h1", {}, "Sandbox ", h("span", { class: "id" }, id)), details,
              h("h2", {}, "Terminal"), open, termBox, h("h2", {}, "Files"), files);

  (async () => {
    let s;
    try {
      ({ data: s } = await call("GET", `/sandboxes/${encodeURIComponent(id)}`));
    } catch (e) {
      if (e.status !== 401) notice(e.message, true);
      return;
    }
    const item = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
    details.replaceChildren(
      ...item("Template", s.alias || s.templateID),
      ...item("State", s.state),
      ...item("Started", `${ago(s.startedAt)} ago (${s.startedAt})`),
      ...item("Time left", s.state === "running" ? left(s.endAt) : "—"),
      ...item("Shape", `${s.cpuCount} CPU, ${s.memoryMB} MiB, ${s.diskSizeMB} MiB disk`),
      ...item("Metadata", Object.entries(s.metadata || {}).map(([k, v]) => `${k}=${v}`)
        .join(", ") || "—"));
    if (s.state !== "running") {
      open.disabled = true;
      return;
    }
    files.replaceChildren(fileBrowser(new Agent(id, s.envdAccessToken)));
  })();

  return () => {
    if (close) close();
  };
}
