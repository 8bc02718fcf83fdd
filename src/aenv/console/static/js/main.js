// The console's pages by the URL's fragment (which never holds the key): the login while no
// key is kept, else the page named.
import { clearKey, key, loadConfig } from "./api.js";
import * as admin from "./admin.js";
import * as login from "./login.js";
import * as nodes from "./nodes.js";
import * as overview from "./overview.js";
import * as sandbox from "./sandbox.js";
import * as sandboxes from "./sandboxes.js";
import * as storage from "./storage.js";
import * as templates from "./templates.js";
import { notice } from "./ui.js";

const pages = { "#/overview": overview, "#/sandboxes": sandboxes, "#/templates": templates,
                "#/storage": storage, "#/nodes": nodes, "#/admin": admin };
const HOME = "#/sandboxes";
let leave = null; // the shown page's cleanup (its timers)
let reason = ""; // why the login is shown again

function show() {
  if (leave) leave();
  leave = null;
  const main = document.getElementById("main");
  main.replaceChildren();
  const loggedIn = Boolean(key());
  document.getElementById("nav").hidden = !loggedIn;
  document.getElementById("logout").hidden = !loggedIn;
  if (!loggedIn) {
    login.render(main, reason, () => {
      reason = "";
      notice("");
      if (location.hash === HOME) show(); else location.hash = HOME;
    });
    return;
  }
  const one = location.hash.match(/^#\/sandbox\/([\w-]+)$/);
  const page = one ? { render: (m) => sandbox.render(m, one[1]) } : pages[location.hash];
  if (!page) {
    location.hash = HOME;
    return;
  }
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.getAttribute("href") === location.hash) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  leave = page.render(main) || null;
  main.focus();
}

window.addEventListener("hashchange", () => {
  notice("");
  show();
});
window.addEventListener("aenv:logout", (e) => {
  clearKey();
  reason = e.detail;
  notice("");
  show();
});
document.getElementById("logout").addEventListener("click", () => {
  clearKey();
  reason = "";
  notice("");
  show();
});

loadConfig().then(show, (e) => notice(`The console's configuration did not load: ${e}`, true));
