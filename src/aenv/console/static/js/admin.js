// Teams and keys (admin keys only): teams with their limits and use, keys, a new key (shown
// once) and revocation. A key that is not an admin's sees the API's 403 and nothing else.
import { call } from "./api.js";
import { actionButton, h, notice, table } from "./ui.js";

export function render(main) {
  const body = h("div", { id: "admin" });
  main.append(h("h1", {}, "Teams and keys"), body);

  async function load() {
    let teams, keys;
    try {
      [teams, keys] = await Promise.all([call("GET", "/admin/teams"),
                                         call("GET", "/admin/keys")]);
    } catch (e) {
      if (e.status === 403) {
        body.replaceChildren(h("p", { class: "message", id: "forbidden", role: "alert" },
          `403: ${e.message}`));
      } else if (e.status !== 401) {
        notice(e.message, true);
      }
      return;
    }
    const names = new Map(teams.data.map((t) => [t.teamID, t.name]));
    body.replaceChildren(
      h("h2", {}, "Teams"),
      table(["Name", "ID", "Sandboxes", "Memory", ""], teams.data.map((t) =>
        h("tr", { "data-team": t.name },
          h("td", {}, t.name), h("td", { class: "id" }, t.teamID),
          h("td", {}, `${t.usage.sandboxes} of ${t.maxSandboxes ?? "no limit"}`),
          h("td", {}, `${t.usage.memoryMB} MiB of ${t.maxMemoryMB ?? "no limit"}`),
          h("td", { class: "actions" }, limit(t, "maxSandboxes", "Sandbox limit"),
            limit(t, "maxMemoryMB", "Memory limit (MiB)"))))),
      newTeam(),
      h("h2", {}, "Keys"),
      table(["Key", "Name", "Team", "Admin", "Created", "Revoked", ""],
        keys.data.map((k) => h("tr", { "data-key": k.keyID },
          h("td", { class: "id" }, k.mask), h("td", {}, k.name),
          h("td", {}, names.get(k.teamID) || k.teamID), h("td", {}, k.admin ? "yes" : "no"),
          h("td", {}, k.createdAt), h("td", {}, k.revokedAt || "—"),
          h("td", {}, k.revokedAt ? "" : revoke(k))))),
      newKey(teams.data));
  }

  // A team's limit set (a number) or lifted (empty).
  function limit(t, field, label) {
    return actionButton({
      label: label.split(" (")[0], what: t.name, after: load,
      question: `${label} of team ${t.name} (empty: none)?`,
      field: { label, type: "number", value: t[field] ?? "" },
      run: async (value) => {
        await call("PATCH", `/admin/teams/${encodeURIComponent(t.teamID)}`,
                   { [field]: value === "" ? null : Number(value) });
        return `Team ${t.name}: ${label.toLowerCase()} ${value === "" ? "lifted" : value}.`;
      },
    });
  }

  function newTeam() {
    const name = h("input", { id: "t-name", required: true, size: 16 });
    const max = h("input", { id: "t-max", type: "number", min: 1, size: 6 });
    const mem = h("input", { id: "t-mem", type: "number", min: 1, size: 8 });
    const form = h("form", {
      class: "row",
      onsubmit: async (ev) => {
        ev.preventDefault();
        try {
          await call("POST", "/admin/teams", { name: name.value.trim(),
            maxSandboxes: max.value ? Number(max.value) : null,
            maxMemoryMB: mem.value ? Number(mem.value) : null });
          notice(`Made team ${name.value.trim()}.`);
        } catch (e) {
          if (e.status !== 401) notice(`The team was refused: ${e.message}`, true);
        }
        load();
      },
    }, h("label", { for: "t-name" }, "Name", name),
    h("label", { for: "t-max" }, "Max sandboxes", max),
    h("label", { for: "t-mem" }, "Max memory (MiB)", mem),
    h("button", { type: "submit" }, "New team"));
    return h("section", {}, h("h2", {}, "New team"), form);
  }

  function revoke(k) {
    return actionButton({
      label: "Revoke", what: k.mask, after: load, attrs: { class: "danger" },
      question: `Revoke key ${k.mask} (${k.name || "unnamed"})? Whoever holds it loses `
        + "access at once.",
      run: async () => {
        await call("DELETE", `/admin/keys/${encodeURIComponent(k.keyID)}`);
        return `Revoked ${k.mask}.`;
      },
    });
  }

  function newKey(teams) {
    const team = h("select", { id: "k-team" },
      teams.map((t) => h("option", { value: t.teamID }, t.name)));
    const name = h("input", { id: "k-name", size: 16 });
    const isAdmin = h("input", { id: "k-admin", type: "checkbox" });
    const form = h("form", {
      class: "row",
      onsubmit: async (ev) => {
        ev.preventDefault();
        try {
          const made = await call("POST", "/admin/keys", {
            team: team.value, name: name.value.trim(), admin: isAdmin.checked });
          await load();
          // The secret is shown this once, and only on the page: the API keeps its hash.
          document.getElementById("new-key-slot").replaceChildren(
            h("p", {}, "The new key, shown this once:"),
            h("code", { class: "secret", id: "new-key-secret" }, made.data.key));
        } catch (e) {
          if (e.status !== 401) notice(`The key was refused: ${e.message}`, true);
        }
      },
    }, h("label", { for: "k-team" }, "Team", team), h("label", { for: "k-name" }, "Name", name),
    h("label", { for: "k-admin", class: "inline" }, isAdmin, "admin"),
    h("button", { type: "submit" }, "New key"));
    return h("section", {}, h("h2", {}, "New key"), form,
             h("div", { id: "new-key-slot" }));
  }

  load();
  return null;
}
