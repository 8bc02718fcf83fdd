// Snapshots and volumes: the team's snapshots (a sandbox made from one, delete) and volumes
// (new, delete; the API refuses one a sandbox mounts, and says so).
import { call } from "./api.js";
import { actionButton, ago, bytes, h, notice, table } from "./ui.js";

export function render(main) {
  const snapshots = h("div", { id: "snapshots" });
  const volumes = h("div", { id: "volumes" });
  const volumeName = h("input", { id: "v-name", required: true, size: 20 });

  async function load() {
    let snaps, vols;
    try {
      [snaps, vols] = await Promise.all([call("GET", "/snapshots"), call("GET", "/volumes")]);
    } catch (e) {
      if (e.status !== 401) notice(e.message, true);
      return;
    }
    snapshots.replaceChildren(snaps.data.length ? table(
      ["Snapshot", "Names", "Of", "Taken", "Size", ""],
      snaps.data.map((s) => h("tr", { "data-snapshot": s.snapshotID },
        h("td", { class: "id" }, s.snapshotID), h("td", {}, s.names.join(", ") || "—"),
        h("td", {}, s.sandboxID ? h("a", { href: `#/sandbox/${s.sandboxID}`, class: "id" },
          s.sandboxID) : "—", s.templateID ? ` (${s.templateID})` : ""),
        h("td", { title: s.createdAt || "" }, s.createdAt ? `${ago(s.createdAt)} ago` : "—"),
        h("td", { class: "size" }, bytes(s.sizeBytes || 0)),
        h("td", { class: "actions" },
          button(`New sandbox from ${s.snapshotID}?`, "New sandbox", s.snapshotID, async () => {
            const { data } = await call("POST",
              `/snapshots/${encodeURIComponent(s.snapshotID)}/fork`, { count: 1 });
            if (data[0].error) throw new Error(data[0].error.message);
            return `Made ${data[0].sandbox.sandboxID} from ${s.snapshotID}.`;
          }),
          button(`Delete snapshot ${s.snapshotID}? Sandboxes made from it keep running.`,
            "Delete", s.snapshotID, async () => {
              await call("DELETE", `/templates/${encodeURIComponent(s.snapshotID)}`);
              return `Deleted ${s.snapshotID}.`;
            })))))
      : h("p", { class: "muted" }, "No snapshots."));
    volumes.replaceChildren(vols.data.length ? table(["Volume", "ID", "Size", ""],
      vols.data.map((v) => h("tr", { "data-volume": v.name },
        h("td", {}, v.name), h("td", { class: "id" }, v.volumeID),
        h("td", { class: "size" }, bytes(v.sizeBytes || 0)),
        h("td", {}, button(`Delete volume ${v.name}? Its files are lost.`, "Delete", v.name,
          async () => {
            await call("DELETE", `/volumes/${encodeURIComponent(v.volumeID)}`);
            return `Deleted volume ${v.name}.`;
          })))))
      : h("p", { class: "muted" }, "No volumes."));
  }

  function button(question, label, what, run) {
    return actionButton({ label, what, question, run, after: load });
  }

  const form = h("form", {
    class: "row",
    onsubmit: async (ev) => {
      ev.preventDefault();
      try {
        await call("POST", "/volumes", { name: volumeName.value.trim() });
        notice(`Made volume ${volumeName.value.trim()}.`);
        volumeName.value = "";
      } catch (e) {
        if (e.status !== 401) notice(`The volume was refused: ${e.message}`, true);
      }
      load();
    },
  }, h("label", { for: "v-name" }, "Name", volumeName), h("button", { type: "submit" }, "New volume"));

  main.append(h("h1", {}, "Snapshots and volumes"), h("h2", {}, "Snapshots"), snapshots,
              h("h2", {}, "Volumes"), volumes, form);
  load();
  return null;
}
