import { ApiError, apiOrigin, check, setKey } from "./api.js";
import { h } from "./ui.js";

// The login: a key, checked against the API before it is kept.
export function render(main, reason, done) {
  const input = h("input", { id: "key", type: "password", autocomplete: "off", required: true,
                             spellcheck: "false" });
  const message = h("p", { id: "login-message", class: "message", role: "alert" }, reason);
  const button = h("button", { type: "submit" }, "Log in");
  const form = h("form", {
    onsubmit: async (ev) => {
      ev.preventDefault();
      const k = input.value.trim();
      message.textContent = "";
      button.disabled = true;
      try {
        await check(k);
        setKey(k);
        done();
      } catch (e) {
        message.textContent = e instanceof ApiError && e.status === 401
          ? `That key was refused: ${e.message}.` : e.message;
        input.focus();
      } finally {
        button.disabled = false;
      }
    },
  }, h("label", { for: "key" }, "API key"), input, button);
  main.append(h("section", { class: "login" },
    h("h1", {}, "Log in"),
    h("p", { class: "muted" }, `The E2B API at ${apiOrigin()}. The key stays in this tab.`),
    form, message));
  input.focus();
}
