// A file browser on a running sandbox: a directory's entries (the agent's ListDir), a file
// downloaded, a file uploaded into the directory shown.
import { h, notice, table } from "./ui.js";

const HOME = "/home/user";

export function fileBrowser(agent) {
  const where = h("input", { id: "dir", value: HOME, size: 30, "aria-label": "Directory" });
  const list = h("div", { id: "files" });
  const upload = h("input", { id: "upload", type: "file", "aria-label": "File to upload" });

  async function show(dir) {
    where.value = dir;
    let out;
    try {
      out = await agent.unary("filesystem.Filesystem/ListDir", { path: dir, depth: 1 });
    } catch (e) {
      notice(`Listing ${dir} was refused: ${e.message}`, true);
      return;
    }
    const entries = (out.entries || []).sort((a, b) => a.name.localeCompare(b.name));
    const up = dir === "/" ? null : dir.replace(/\/[^/]+\/?$/, "") || "/";
    list.replaceChildren(table(["Name", "Type", "Size", ""], [
      up && h("tr", {}, h("td", {}, h("button", { type: "button", onclick: () => show(up) },
        "..")), h("td", {}, "directory"), h("td", {}), h("td", {})),
      ...entries.map((e) => {
        const dirEntry = e.type === "FILE_TYPE_DIRECTORY";
        return h("tr", { "data-file": e.name },
          h("td", {}, dirEntry ? h("button", { type: "button", onclick: () => show(e.path) },
            e.name) : e.name),
          h("td", {}, dirEntry ? "directory" : "file"),
          h("td", {}, dirEntry ? "" : `${e.size ?? 0} B`),
          h("td", {}, dirEntry ? "" : h("button", {
            type: "button", "aria-label": `Download ${e.name}`,
            onclick: () => download(e.path, e.name) }, "Download")));
      })]));
  }

  async function download(path, name) {
    try {
      const blob = await agent.download(path);
      const a = h("a", { href: URL.createObjectURL(blob), download: name });
      a.click();
      setTimeout(() => URL.revokeObjectURL(a.href), 10000);
    } catch (e) {
      notice(`Downloading ${path} was refused: ${e.message}`, true);
    }
  }

  const form = h("form", {
    class: "row",
    onsubmit: async (ev) => {
      ev.preventDefault();
      const dir = where.value.replace(/\/+$/, "") || "/";
      const file = upload.files[0];
      if (!file) return;
      const path = `${dir === "/" ? "" : dir}/${file.name}`;
      notice(`Uploading ${path}…`);
      try {
        await agent.upload(path, file);
        notice(`Uploaded ${path}.`);
      } catch (e) {
        notice(`Uploading ${path} was refused: ${e.message}`, true);
      }
      show(dir);
    },
  }, upload, h("button", { type: "submit" }, "Upload"));

  const nav = h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); show(where.value); } },
    where, h("button", { type: "submit" }, "List"));
  show(HOME);
  return h("section", { id: "file-browser" }, nav, list, form);
}
