// Small DOM helpers. Text from the API only ever goes in as text (never as HTML): metadata,
// names and messages are the sandboxes' owners' words.
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

// The notice under the header: what an action did, or why it was refused.
export function notice(text, error = false) {
  const n = document.getElementById("notice");
  n.className = error ? "error" : "";
  n.setAttribute("role", error ? "alert" : "status");
  n.textContent = text || "";
}

// Asks before an action; resolves true for OK (or, with `field` {label, type, value}, the
// value typed; null for Cancel). A <dialog> keeps focus inside while open.
export function confirmAction(question, label, field = null) {
  const d = document.getElementById("confirm");
  const box = document.getElementById("confirm-field");
  const input = document.getElementById("confirm-input");
  document.getElementById("confirm-text").textContent = question;
  document.getElementById("confirm-ok").textContent = label;
  box.hidden = !field;
  if (field) {
    document.getElementById("confirm-label").textContent = field.label;
    input.type = field.type || "text";
    input.value = field.value ?? "";
  }
  d.returnValue = "";
  d.showModal();
  (field ? input : document.getElementById("confirm-ok")).focus();
  return new Promise((resolve) => {
    d.addEventListener("close", () => {
      const ok = d.returnValue === "ok";
      resolve(field ? (ok ? input.value.trim() : null) : ok);
    }, { once: true });
  });
}

// A button that asks first (with `field`: for a value too), runs `run(value)`, shows what
// it returns (or the API's refusal), then calls `after()`.
export function actionButton({ label, what, question, run, after, field = null, attrs = {} }) {
  return h("button", {
    type: "button", "aria-label": `${label} ${what}`, ...attrs,
    onclick: async (ev) => {
      const button = ev.currentTarget;
      const answer = await confirmAction(question, label, field);
      if (answer === false || answer === null) {
        button.focus();
        return;
      }
      button.disabled = true;
      notice(`${label}: ${what}…`);
      try {
        notice(await run(answer));
      } catch (e) {
        if (e.status !== 401) notice(`${label} ${what} was refused: ${e.message}`, true);
      }
      await after();
    },
  }, label);
}

export const dialogOpen = () => document.getElementById("confirm").open;

export function table(headers, rows) {
  return h("div", { class: "table" },
    h("table", {},
      h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows)));
}

export function ago(iso) {
  return span((Date.now() - Date.parse(iso)) / 1000);
}

export function left(iso) {
  const s = (Date.parse(iso) - Date.now()) / 1000;
  return s <= 0 ? "ending" : span(s);
}

function span(s) {
  if (s < 60) return `${Math.max(0, Math.round(s))} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

export function bytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}
