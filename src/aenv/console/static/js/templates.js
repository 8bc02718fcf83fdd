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
  const dockerfileFile = h("input", { id: "b-file", type: "file", "aria-label": "Dockerfile file",
    onchange: async () => {
      if (dockerfileFile.files[0]) text.value = await dockerfileFile.files[0].text();
    } });
  const context = h("input", { id: "b-context", type: "file", accept: ".tar,.tar.gz,.tgz" });
  const status = h("p", { id: "build-status", role: "status" });
  const log = h("pre", { id: "build-log", class: "log", tabindex: "0" });
  let stopped = false;

  async function load() {
    try {
      const { data } = await call("GET", "/templates");
      // Each one's tags (a template made by a build has them; others answer none).
      const tags = await Promise.all(data.map((t) => call("GET",
        `/templates/${encodeURIComponent(t.templateID)}/tags`)
        .then((r) => r.data.map((x) => x.tag).join(", "), () => "")));
      list.replaceChildren(table(["Name", "Tags", "Status", "Source", "Size", "Shape"],
        data.map((t, i) => h("tr", { "data-template": t.templateID },
          h("td", {}, [t.templateID, ...t.aliases.filter((a) => a !== t.templateID)].join(", ")),
          h("td", { class: "tags" }, tags[i] || "—"),
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
      notice("");
      status.textContent = "Starting the build…";
      try {
        const files = context.files[0];
        const { data } = await call("POST", "/v3/templates/dockerfile", {
          name: name.value.trim(), dockerfile: text.value,
          context: files ? base64(new Uint8Array(await files.arrayBuffer())) : null });
        follow(data.templateID, data.buildID);
      } catch (e) {
        status.textContent = "";
        if (e.status !== 401) notice(`The build was refused: ${e.message}`, true);
      }
    },
  }, h("div", { class: "row" }, h("label", { for: "b-name" }, "Name", name)),
  h("label", { for: "b-dockerfile" }, "Dockerfile (pasted, or from a file)", text),
  h("div", { class: "row" }, dockerfileFile,
    h("label", { for: "b-context" }, "Its COPY files: a .tar or .tar.gz (under 700 KiB)",
      context),
    h("button", { type: "submit" }, "Build")));

  main.append(h("h1", {}, "Templates"), list, h("h2", {}, "Build from a Dockerfile"), form,
              status, log);
  load();
  return () => { stopped = true; };
}

function base64(bytes) {
  let out = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    out += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(out);
}
