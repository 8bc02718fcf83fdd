// A terminal on a sandbox's PTY: bash started through the agent's Process service, its output
// written into xterm.js, keys sent back as the PTY's input (in order, batched while a send is
// in flight), the size followed. Ctrl-C is the PTY's: the shell's line discipline signals.
import { fromBase64, toBase64 } from "./envd.js";

const SHELL = { cmd: "/bin/bash", args: ["-i", "-l"], cwd: "/home/user",
                envs: { TERM: "xterm-256color", LANG: "C.UTF-8" } };

async function libraries() {
  try {
    const [{ Terminal }, { FitAddon }] = await Promise.all([
      import("/vendor/xterm/lib/xterm.mjs"), import("/vendor/addon-fit/lib/addon-fit.mjs")]);
    return { Terminal, FitAddon };
  } catch {
    throw new Error("the terminal's library is not installed on the node (make setup)");
  }
}

// Opens a terminal in `box`; returns its close(). Errors go to onError.
export async function openTerminal(box, agent, onError) {
  const { Terminal, FitAddon } = await libraries();
  const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 2000 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  const stop = new AbortController();
  let pid = null;
  let pending = [];
  let sending = false;
  const encoder = new TextEncoder();

  async function flush() {
    if (sending || pid === null || !pending.length) return;
    sending = true;
    try {
      while (pending.length) {
        const bytes = concat(pending);
        pending = [];
        await agent.unary("process.Process/SendInput",
          { process: { pid }, input: { pty: toBase64(bytes) } });
      }
    } catch (e) {
      onError(`The terminal's input was refused: ${e.message}`);
    } finally {
      sending = false;
    }
  }

  const typed = term.onData((d) => {
    pending.push(encoder.encode(d));
    flush();
  });
  const resized = term.onResize(({ cols, rows }) => {
    if (pid !== null) {
      agent.unary("process.Process/Update", { process: { pid }, pty: { size: { cols, rows } } })
        .catch(() => {});
    }
  });
  const refit = () => fit.fit();
  window.addEventListener("resize", refit);

  agent.stream("process.Process/Start",
    { process: SHELL, pty: { size: { cols: term.cols, rows: term.rows } } },
    (msg) => {
      const ev = msg.event || {};
      if (ev.start) {
        pid = ev.start.pid;
        flush();
      } else if (ev.data && ev.data.pty) {
        term.write(fromBase64(ev.data.pty));
      } else if (ev.end) {
        term.write("\r\n[the shell ended]\r\n");
      }
    }, stop.signal).catch((e) => {
    if (!stop.signal.aborted) onError(`The terminal ended: ${e.message}`);
  });
  term.focus();

  return () => {
    stop.abort();
    if (pid !== null) {
      agent.unary("process.Process/SendSignal", { process: { pid }, signal: "SIGNAL_SIGKILL" })
        .catch(() => {});
    }
    typed.dispose();
    resized.dispose();
    window.removeEventListener("resize", refit);
    term.dispose();
  };
}

function concat(chunks) {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}
