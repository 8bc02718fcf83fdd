// A sandbox's agent (envd's protocol) through the data plane, as E2B's JS SDK reaches it from
// a browser: /proxy/<id>/49983/ on the API's origin, with the sandbox's access token (from
// the control plane) and Connect's JSON codec.
import { apiOrigin, call } from "./api.js";

const AGENT_PORT = 49983;
const USER = "user";

export class Agent {
  constructor(id, token) {
    this.base = `${apiOrigin()}/proxy/${encodeURIComponent(id)}/${AGENT_PORT}`;
    this.headers = { "Connect-Protocol-Version": "1", Authorization: `Basic ${btoa(USER + ":")}` };
    if (token) this.headers["X-Access-Token"] = token;
  }

  // The agent of a running sandbox (its token from getSandbox).
  static async of(id) {
    const { data } = await call("GET", `/sandboxes/${encodeURIComponent(id)}`);
    if (data.state !== "running") throw new Error(`${id} is ${data.state}: resume it first`);
    return new Agent(id, data.envdAccessToken);
  }

  async unary(method, body) {
    const r = await fetch(`${this.base}/${method}`, {
      method: "POST", credentials: "omit", cache: "no-store",
      headers: { ...this.headers, "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const out = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(out.message || `${method}: ${r.status}`);
    return out;
  }

  // A server stream: calls onMessage for each message; resolves when the stream ends.
  async stream(method, body, onMessage, signal) {
    const json = new TextEncoder().encode(JSON.stringify(body));
    const frame = new Uint8Array(5 + json.length);
    new DataView(frame.buffer).setUint32(1, json.length);
    frame.set(json, 5);
    const r = await fetch(`${this.base}/${method}`, {
      method: "POST", credentials: "omit", cache: "no-store", signal,
      headers: { ...this.headers, "Content-Type": "application/connect+json" },
      body: frame,
    });
    if (!r.ok) {
      const out = await r.json().catch(() => ({}));
      throw new Error(out.message || `${method}: ${r.status}`);
    }
    const reader = r.body.getReader();
    let buf = new Uint8Array(0);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      const joined = new Uint8Array(buf.length + value.length);
      joined.set(buf);
      joined.set(value, buf.length);
      buf = joined;
      while (buf.length >= 5) {
        const flags = buf[0];
        const size = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
        if (buf.length < 5 + size) break;
        const msg = JSON.parse(new TextDecoder().decode(buf.subarray(5, 5 + size)) || "{}");
        buf = buf.slice(5 + size);
        if (flags & 2) { // the end of the stream: an error, or none
          if (msg.error) throw new Error(msg.error.message || msg.error.code);
          return;
        }
        onMessage(msg);
      }
    }
  }
}

// The agent's /files: a file's bytes, and an upload (multipart, as the SDK sends it).
Agent.prototype.download = async function download(path) {
  const r = await fetch(`${this.base}/files?${new URLSearchParams({ path, username: USER })}`, {
    credentials: "omit", cache: "no-store", headers: this.tokenHeader(),
  });
  if (!r.ok) throw new Error(await failure(r));
  return r.blob();
};

Agent.prototype.upload = async function upload(path, file) {
  const form = new FormData();
  form.append("file", file, file.name);
  const r = await fetch(`${this.base}/files?${new URLSearchParams({ path, username: USER })}`, {
    method: "POST", credentials: "omit", cache: "no-store", headers: this.tokenHeader(),
    body: form,
  });
  if (!r.ok) throw new Error(await failure(r));
};

Agent.prototype.tokenHeader = function tokenHeader() {
  const t = this.headers["X-Access-Token"];
  return t ? { "X-Access-Token": t } : {};
};

async function failure(r) {
  const out = await r.json().catch(() => ({}));
  return `${r.status}: ${out.message || r.statusText}`;
}

export const toBase64 = (bytes) => btoa(String.fromCharCode(...bytes));
export const fromBase64 = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
