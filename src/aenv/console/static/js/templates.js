// Templates: the team's and the public ones with their source, size and status, and a build
// from a pasted Dockerfile whose log shows as it runs (POST /v3/templates/dockerfile, then
// getTemplateBuildStatus).
import { call } from "./api.js";
import { h, notice, table } from "./ui.js";

const POLL_MS = 1000;

export function render(main) {
  const list = h("div", { id: "templates" });
  const name = h("input", { id: "b-name", required: true, size: 20, placeholder: "name[:tag]" });
  const text = h("textarea", { id: "b-dockerfile", rows: 8, cols: 60, required: true,
                               spellcheck: "false", placeholder: "FROM e2bdev/base\nRUN ..." });
  const status = h("p", { id: "build-status", role: "status" });
  const log = h("pre", { id: "build-log", class: "log", tabindex: "0" });
  let stopped = false;

  async function load() {
    try {
      const { data } = await call("GET", "/templates");
      list.replaceChildren(table(["Name", "Status", "Source", "Size", "Shape"], data.map((t) =>
        h("tr", { "data-template": t.templateID },
          h("td", {}, [t.templateID, ...t.aliases.filter((a) => a !== t.templateID)].join(", ")),
          h("td", {}, t.buildStatus), h("td", { class: "wrap" }, t.source || "—"),
          h("td", {}, t.sizeBytes ? `${(t.sizeBytes / 2 ** 20).toFixed(0)} MiB` : "—"),
          h("td", {}, `${t.cpuCount} CPU, ${t.memoryMB} MiB`)))));
    } catch (e) {
      if (e.status !== 401) notice(e.message, true);
    }
  }

  async function follow(tid, bid) {
    let offset = 0;
    for (;;) {
      if (stopped) return;
      let s;
      try {
        ({ data: s } = await call("GET", `/templates/${encodeURIComponent(tid)}/builds/`
          + `${encodeURIComponent(bid)}/status?logsOffset=${offset}`));
      } catch (e) {
        if (e.status !== 401) status.textContent = `The build's status did not come: ${e.message}`;
        return;
      }
      offset += s.logs.length;
      if (s.logs.length) log.append(s.logs.join("\n") + "\n");
      status.textContent = `Build ${bid} of ${tid}: ${s.status}`
        + (s.reason ? ` (${s.reason.message || JSON.stringify(s.reason)})` : "");
      if (s.status === "ready" || s.status === "error") {
        load();
        return;
      }
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  const form = h("form", {
    id: "build-form",
    onsubmit: async (ev) => {
      ev.preventDefault();
      log.textContent = "";
      status.textContent = "Starting the build…";
      try {
        const { data } = await call("POST", "/v3/templates/dockerfile",
          { name: name.value.trim(), dockerfile: text.value });
        follow(data.templateID, data.buildID);
      } catch (e) {
        status.textContent = "";
        if (e.status !== 401) notice(`The build was refused: ${e.message}`, true);
      }
    },
  }, h("div", { class: "row" }, h("label", { for: "b-name" }, "Name", name)),
  h("label", { for: "b-dockerfile" }, "Dockerfile (no COPY or ADD: no context is sent)", text),
  h("div", { class: "row" }, h("button", { type: "submit" }, "Build")));

  main.append(h("h1", {}, "Templates"), list, h("h2", {}, "Build from a Dockerfile"), form,
              status, log);
  load();
  return () => { stopped = true; };
}
