// The API client: every call goes to the API's origin (from /config.json) with the key kept
// in this tab's sessionStorage; never in a URL, a cookie or localStorage.
const KEY = "aenv.key";
const TIMEOUT_MS = 15000;
let api = "";

export async function loadConfig() {
  const r = await fetch("/config.json", { cache: "no-store" });
  api = (await r.json()).api;
  return api;
}

export const apiOrigin = () => api;
export const key = () => sessionStorage.getItem(KEY);
export const setKey = (k) => sessionStorage.setItem(KEY, k);
export const clearKey = () => sessionStorage.removeItem(KEY);

export class ApiError extends Error {
  // status 0: the API did not answer.
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function send(method, path, body, withKey) {
  const headers = { "X-API-Key": withKey };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let r;
  try {
    r = await fetch(api + path, {
      method, headers, cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer",
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(TIMEOUT_MS),
    });
  } catch (e) {
    const why = e.name === "TimeoutError" ? `no answer in ${TIMEOUT_MS / 1000} s` : e.message;
    throw new ApiError(0, `The API at ${api} is unreachable (${why}).`);
  }
  if (!r.ok) {
    let message = `${r.status} ${r.statusText}`;
    try {
      const err = await r.json();
      if (err && err.message) message = err.message;
    } catch { /* not JSON: the status line says it */ }
    throw new ApiError(r.status, message);
  }
  const data = r.status === 204 ? null : await r.json();
  return { data, next: r.headers.get("x-next-token") };
}

// Checks a key before it is kept.
export async function check(k) {
  await send("GET", "/v2/sandboxes?limit=1", undefined, k);
}

// A call with the kept key. A 401 means the key no longer counts (revoked, or the node's
// keys changed): the page goes back to the login with the API's reason.
export async function call(method, path, body) {
  try {
    return await send(method, path, body, key() || "");
  } catch (e) {
    if (e.status === 401) {
      window.dispatchEvent(new CustomEvent("aenv:logout", {
        detail: `Your key was refused (${e.message}): log in again.`,
      }));
    }
    throw e;
  }
}
