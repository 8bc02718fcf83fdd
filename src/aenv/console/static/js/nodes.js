// Nodes (admin keys, through a gateway): the cluster's members with capacity, use and health
// (whether the gateway reaches each now), draining; drain and undrain. A single node has no
// such route: the page says to open the console of the cluster's gateway.
import { call } from "./api.js";
import { actionButton, h, notice, table } from "./ui.js";

const REFRESH_MS = 5000;

export function render(main) {
  const body = h("div", { id: "nodes" });
  main.append(h("h1", {}, "Nodes"), body);

  async function load() {
    let nodes;
    try {
      ({ data: nodes } = await call("GET", "/admin/nodes"));
    } catch (e) {
      if (e.status === 403) {
        body.replaceChildren(h("p", { class: "message", id: "forbidden", role: "alert" },
          `403: ${e.message}`));
      } else if (e.status === 404) {
        body.replaceChildren(h("p", { class: "muted", id: "no-cluster" }, "This API is a "
          + "single node's: the cluster's nodes are listed by the console of its gateway."));
      } else if (e.status !== 401) {
        notice(e.message, true);
      }
      return false;
    }
    body.replaceChildren(table(
      ["Node", "State", "Health", "Sandboxes", "Memory (nominal)", "Held", "Accel", "Updated", ""],
      nodes.map((n) => h("tr", { "data-node": n.name },
        h("td", {}, n.name, h("div", { class: "muted" }, n.url)),
        h("td", { class: "state" }, n.state),
        h("td", { class: "health" }, n.reachable ? "reachable" : "unreachable"),
        h("td", {}, `${n.usage.sandboxes} of ${n.capacity.maxSandboxes}`),
        h("td", {}, `${n.usage.memoryMB} of ${n.capacity.memoryMB} MiB`),
        h("td", {}, `${n.usage.heldMB} of ${n.capacity.budgetMB} MiB`),
        h("td", {}, n.accelerator || "—"),
        h("td", {}, `${n.updatedSecondsAgo} s ago`),
        h("td", {}, n.state === "draining"
          ? button(n.name, "Undrain", `Let ${n.name} take sandboxes again?`, "DELETE")
          : button(n.name, "Drain", `Drain ${n.name}? No new sandboxes go there; its `
                   + "sandboxes run on until they end.", "POST"))))));
    return true;
  }

  function button(name, label, question, method) {
    return actionButton({
      label, what: name, question, after: load,
      run: async () => {
        await call(method, `/admin/nodes/${encodeURIComponent(name)}/drain`,
                   method === "POST" ? { pause: false } : undefined);
        return label === "Drain" ? `${name} is draining.` : `${name} takes sandboxes again.`;
      },
    });
  }

  let timer = null;
  load().then((ok) => {
    if (ok) timer = setInterval(load, REFRESH_MS);
  });
  return () => clearInterval(timer);
}
