"""Fast paths (issue 13): every figure beside the limit it is held to, measured in one run.

Run as root after `aenv setup`:
    .venv/bin/python bench/fast.py [--n 10] [--delays 0,2,10] [--cpu-window 60] [--turns 10]

It starts its own `aenv server`s (bench/node.py's launcher) on the node's data dir and drives
them with the unmodified E2B SDK (AsyncSandbox); the limits come from the raw runtime in this
process (`Runtime`, its own instance) or from the node's own debug timers of the same
operations. p50 unless a row says otherwise.

- hot resume at the API (`connect` of a hot-paused sandbox) | QMP `cont` of a stopped VM
- hot resume + the first `commands.run("true")` | a steady `commands.run("true")`
- pause of a sandbox that dirtied 16 MiB since its last pause | the same pause's stop +
  device-state save + fsync (the node's `pause ...: stop= save= fsync=` debug line)
- cold resume + the first command (a node with AENV_HOT_PAUSE_S=0) | the raw runtime's
  restore of a paused sandbox + its agent's first answer
- fork(count=16), the call | 16 parallel raw restores of the same template
- fork(count=16) until all 16 children answered a command | 16 x one raw child's
  restore-and-first-answer CPU time (its QEMU's utime+stime) / cores
- a hot-paused VMM after its release delay: guest-RAM RSS | what it held running
- a hot-paused VMM's CPU over --cpu-window seconds; its non-guest RSS (reported)
- the turn-boundary loop, per release delay: 16 sandboxes x --turns turns, each a
  resume, one command and a 1 s sleep standing in for the model, then a pause; against the
  same loop without pause/resume (steady), in the same run. Counters and files are checked.

Nothing is asserted (targets live in the issue); everything created is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

import httpx
from node import DATA_DIR, Node, pct  # bench/node.py: the server launcher

from aenv import config as config_mod
from aenv.machines.api import AgentInit
from aenv.machines.runtime import AGENT_PORT, Runtime
from aenv.orchestrator.reclaim import reclaim_runtime
from aenv.vmm import memory
from tests.support import envd_client
from tests.support.host import vmm_of

PAUSE_LINE = re.compile(r"pause (\w+): stop=([\d.]+)ms save=([\d.]+)ms fsync=([\d.]+)ms")
DIRTY_16M = "dd if=/dev/urandom of=/dev/shm/dirty bs=1M count=16 conv=notrunc status=none"
Rows = dict[str, list[float]]


async def timed(aw: Awaitable[Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = await aw
    return time.perf_counter() - t0, out


def sdk_env(node: Node) -> None:
    os.environ.update(E2B_API_KEY=node.key, E2B_API_URL=node.origin,
                      E2B_SANDBOX_URL=node.origin, E2B_DOMAIN="localhost")  # fmt: skip


def find_vmm(instance: str, sandbox_id: str) -> memory.RamMapping:
    """The sandbox's QEMU and its guest RAM (its directory may be a pooled one's)."""
    vmm = vmm_of(instance, sandbox_id, DATA_DIR)
    if vmm is None:
        raise SystemExit(f"no VMM runs {sandbox_id}")
    return vmm


def cpu_ticks(pid: int) -> int:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])  # utime + stime


async def steady_run(sbx: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        dt, _ = await timed(sbx.commands.run("true"))
        out.append(dt)
    return out


# -- a node with the hot tier -------------------------------------------------------------


async def hot_rows(node: Node, n: int, cpu_window: float, res: Rows, info: dict[str, str]
                   ) -> None:
    from e2b import AsyncSandbox

    sbx = await AsyncSandbox.create("base", timeout=900)
    try:
        await sbx.commands.run(DIRTY_16M)  # the file exists from here on
        await steady_run(sbx, 3)
        for _ in range(n):
            res["steady commands.run('true')"] += await steady_run(sbx, 1)
            await sbx.commands.run(DIRTY_16M)
            dt, _ = await timed(sbx.pause())
            res["pause after dirtying 16 MiB"].append(dt)
            await asyncio.sleep(1)
            dt, _ = await timed(sbx.connect(timeout=900))
            res["hot resume at the API (SDK connect)"].append(dt)
            dc, _ = await timed(sbx.commands.run("true"))
            res["hot resume + first commands.run('true')"].append(dt + dc)
        # The same through one kept-alive HTTP connection (the SDK opens a client per call).
        async with httpx.AsyncClient(base_url=node.origin, headers={"X-API-Key": node.key}
                                     ) as http:  # fmt: skip
            for _ in range(n):
                await sbx.pause()
                await asyncio.sleep(0.5)
                dt, r = await timed(http.post(f"/sandboxes/{sbx.sandbox_id}/connect",
                                              json={"timeout": 900}))  # fmt: skip
                r.raise_for_status()
                res["hot resume at the API (HTTP keep-alive)"].append(dt)
        # RSS and CPU of a hot-paused VMM: running, then after its release delay.
        vmm = find_vmm(node.instance, sbx.sandbox_id)
        running = memory.mapping_rss(vmm)
        await sbx.pause()
        await asyncio.sleep(float(node.extra_env["AENV_HOT_RELEASE_DELAY_S"]) + 1.5)
        released = memory.mapping_rss(vmm)
        c0, t0 = cpu_ticks(vmm.pid), time.monotonic()
        await asyncio.sleep(cpu_window)
        cpu = (cpu_ticks(vmm.pid) - c0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)
        total = memory.process_rss(vmm.pid)
        info["guest-RAM RSS running"] = f"{running >> 20} MiB"
        info["guest-RAM RSS hot, after the release delay"] = (
            f"{released >> 20} MiB ({100 * released / max(running, 1):.1f} % of running)")
        info[f"hot VMM CPU over {cpu_window:.0f} s"] = f"{100 * cpu:.3f} %"
        info["hot VMM non-guest RSS"] = f"{(total - released) >> 20} MiB"
        await sbx.connect(timeout=900)
        t1 = time.perf_counter()
        await sbx.commands.run("true")
        info["first command after a released hot resume"] = (
            f"{(time.perf_counter() - t1) * 1e3:.0f} ms")
    finally:
        await sbx.kill()


async def fork_rows(node: Node, n: int, res: Rows, info: dict[str, str]) -> None:
    """Also: the CPU the node process and this client (the SDK) spend on the same forks,
    beside the children's, which is all the limit counts."""
    from e2b import AsyncSandbox

    assert node.proc is not None
    hz = os.sysconf("SC_CLK_TCK")
    src = await AsyncSandbox.create("base", timeout=900)
    node_cpu: list[float] = []
    client_cpu: list[float] = []
    kids_cpu: list[float] = []  # their QEMUs' whole lives: restore, /init, the command
    try:
        for _ in range(max(1, n // 5)):
            n0, c0 = cpu_ticks(node.proc.pid), sum(os.times()[:2])
            dt, kids = await timed(src.fork(count=16, timeout=600))
            res["fork(count=16), the call"].append(dt)
            ok = [k for k in kids if not isinstance(k, Exception)]
            t1 = time.perf_counter()
            await asyncio.gather(*(k.commands.run("true") for k in ok))
            res["fork(count=16), until all 16 answered a command"].append(
                dt + time.perf_counter() - t1)
            node_cpu.append((cpu_ticks(node.proc.pid) - n0) / hz)
            client_cpu.append(sum(os.times()[:2]) - c0)
            with contextlib.suppress(OSError, SystemExit):
                kids_cpu.append(sum(cpu_ticks(find_vmm(node.instance, k.sandbox_id).pid)
                                    for k in ok) / hz)  # fmt: skip
            if len(ok) < 16:
                print(f"fork x16: {16 - len(ok)} children failed: {kids}")
            await asyncio.gather(*(k.kill() for k in ok))
    finally:
        await src.kill()
    info["fork x16 until answered: node process CPU"] = f"{pct(node_cpu, 50):.2f} s"
    info["fork x16 until answered: client (SDK) CPU"] = f"{pct(client_cpu, 50):.2f} s"
    if kids_cpu:
        info["fork x16 until answered: the 16 children's QEMU CPU"] = f"{pct(kids_cpu, 50):.2f} s"


def pause_limits(log: Path, n: int, res: Rows) -> None:
    """The node's own stop + save + fsync of each timed pause (same run, same pages): the
    log's first `n` pauses are the timed ones."""
    xs = [sum(map(float, m.groups()[1:])) / 1000 for m in PAUSE_LINE.finditer(log.read_text())]
    res["stop + device-state save + fsync (same pauses)"] = xs[:n]


# -- the cold tier, and the raw runtime's limits --------------------------------------------


async def cold_rows(n: int, res: Rows) -> None:
    from e2b import AsyncSandbox

    sbx = await AsyncSandbox.create("base", timeout=900)
    try:
        for _ in range(n):
            await sbx.pause()
            dt, _ = await timed(sbx.connect(timeout=900))
            dc, _ = await timed(sbx.commands.run("true"))
            res["cold resume + first command"].append(dt + dc)
    finally:
        await sbx.kill()


async def raw_rows(n: int, res: Rows) -> None:
    cfg = config_mod.load(instance="r" + os.urandom(3).hex(), primed_pool_size=0,
                          hot_pause_s=0, warm_pool_size=2)  # fmt: skip
    rt = Runtime(cfg)
    await rt.start()
    try:
        await asyncio.sleep(2)  # its warm pool fills
        sid = "raw" + uuid.uuid4().hex[:10]
        await rt.create(sid, cfg.default_template, AgentInit())
        m = rt.machines()[sid]
        for _ in range(n):
            await m.vm.pause()
            await asyncio.sleep(0.2)
            dt, _ = await timed(m.vm.resume())
            res["QMP cont of a stopped VM"].append(dt)
        # Each machine's own client: a slot address is reused by the next VM.
        for _ in range(n):
            await rt.pause(sid)
            t0 = time.perf_counter()
            m = await rt.restore(sid, None)
            (await m.http.get(m.slot.url(AGENT_PORT) + "/health")).raise_for_status()
            res["raw restore of a paused sandbox + first agent answer"].append(
                time.perf_counter() - t0)
            await rt.push_init(m, AgentInit())
            # ... and what its first command costs on top (translation of the spawn path).
            await rt.pause(sid)
            t0 = time.perf_counter()
            m = await rt.restore(sid, None)
            await asyncio.to_thread(envd_client.run, m.slot.url(AGENT_PORT), "true")
            res["raw restore of a paused sandbox + first command"].append(
                time.perf_counter() - t0)
            await rt.push_init(m, AgentInit())
        await rt.destroy(sid)
        # One child's restore-and-first-command CPU: its QEMU's time, start to answer.
        for _ in range(3):
            kid = "raw" + uuid.uuid4().hex[:10]
            await rt.create(kid, cfg.default_template, AgentInit())
            km = rt.machines()[kid]
            await asyncio.to_thread(envd_client.run, km.slot.url(AGENT_PORT), "true")
            res["one child's restore + first command, CPU"].append(
                cpu_ticks(km.vm.pid) / os.sysconf("SC_CLK_TCK"))
            await rt.destroy(kid)
        tpl = rt.template(cfg.default_template).build_id
        for _ in range(max(1, n // 5)):
            kids = ["raw" + uuid.uuid4().hex[:10] for _ in range(16)]
            t0 = time.perf_counter()
            await asyncio.gather(*(rt.restore(k, tpl) for k in kids))
            res["16 parallel raw restores"].append(time.perf_counter() - t0)
            await asyncio.gather(*(rt.destroy(k) for k in kids))
    finally:
        await rt.close()
        await reclaim_runtime(rt)
        with contextlib.suppress(OSError):
            cfg.sandboxes_dir.rmdir()


# -- the turn-boundary loop -----------------------------------------------------------------


async def turn_loop(count: int, turns: int, *, pause: bool) -> tuple[list[float], bool]:
    """`count` sandboxes, `turns` turns each: (resume,) a command bumping a counter in RAM
    (/dev/shm) and one on disk, a 1 s sleep for the model, (pause). Returns each turn's
    command latency (resume included) and whether every counter reached `turns`."""
    from e2b import AsyncSandbox

    sbxs = await asyncio.gather(*(AsyncSandbox.create("base", timeout=900)
                                  for _ in range(count)))  # fmt: skip
    lat: list[float] = []
    bump = ("n=$(cat /dev/shm/c 2>/dev/null || echo 0); echo $((n+1)) > /dev/shm/c; "
            "m=$(cat ~/c 2>/dev/null || echo 0); echo $((m+1)) > ~/c")

    async def one(sbx: Any, k: int) -> bool:
        await asyncio.sleep(k * 1.0 / count)  # spread: a trainer's turns do not align
        for _ in range(turns):
            t0 = time.perf_counter()
            if pause:
                await sbx.connect(timeout=900)
            await sbx.commands.run(bump)
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(1.0)
            if pause:
                await sbx.pause()
        if pause:
            await sbx.connect(timeout=900)
        r = await sbx.commands.run("cat /dev/shm/c ~/c")
        return r.stdout.split() == [str(turns)] * 2

    try:
        ok = await asyncio.gather(*(one(s, k) for k, s in enumerate(sbxs)))
    finally:
        await asyncio.gather(*(s.kill() for s in sbxs), return_exceptions=True)
    return lat, all(ok)


# -- the table --------------------------------------------------------------------------------

PAIRS = [
    ("hot resume at the API (SDK connect)", "QMP cont of a stopped VM"),
    ("hot resume at the API (HTTP keep-alive)", "QMP cont of a stopped VM"),
    ("hot resume + first commands.run('true')", "steady commands.run('true')"),
    ("pause after dirtying 16 MiB", "stop + device-state save + fsync (same pauses)"),
    ("cold resume + first command", "raw restore of a paused sandbox + first agent answer"),
    ("cold resume + first command", "raw restore of a paused sandbox + first command"),
    ("fork(count=16), the call", "16 parallel raw restores"),
]


def table(res: Rows, info: dict[str, str], loops: list[tuple[str, float, float, float, float,
                                                                 bool]]) -> None:  # fmt: skip
    w = 52
    print(f"\n{'what'.ljust(w)} {'p50 ms':>8} {'p95 ms':>8}   {'limit'.ljust(w)} "
          f"{'p50 ms':>8}  ratio")
    for a, b in PAIRS:
        if res.get(a) and res.get(b):
            pa, pb = pct(res[a], 50), pct(res[b], 50)
            print(f"{a.ljust(w)} {pa * 1e3:8.1f} {pct(res[a], 95) * 1e3:8.1f}   {b.ljust(w)} "
                  f"{pb * 1e3:8.1f}  {pa / pb:5.2f}x")
    a = "fork(count=16), until all 16 answered a command"
    if res.get(a) and res.get("one child's restore + first command, CPU"):
        limit = 16 * pct(res["one child's restore + first command, CPU"], 50) / os.cpu_count()
        pa = pct(res[a], 50)
        print(f"{a.ljust(w)} {pa * 1e3:8.1f} {pct(res[a], 95) * 1e3:8.1f}   "
              f"{'16 x one child restore+command CPU / cores'.ljust(w)} {limit * 1e3:8.1f}  "
              f"{pa / limit:5.2f}x")
    print()
    for k, v in info.items():
        print(f"{k.ljust(w)} {v}")
    if loops:
        print(f"\nturn loop (16 sandboxes; next command's latency, resume included)\n"
              f"{'release delay'.ljust(16)} {'p50 ms':>8} {'p95 ms':>8} {'steady p50':>11} "
              f"{'steady p95':>11} {'p50 x':>6} {'p95 x':>6}  counters+files")
        for label, p50, p95, s50, s95, ok in loops:
            print(f"{label.ljust(16)} {p50 * 1e3:8.0f} {p95 * 1e3:8.0f} {s50 * 1e3:11.0f} "
                  f"{s95 * 1e3:11.0f} {p50 / s50:6.2f} {p95 / s95:6.2f}  "
                  f"{'intact' if ok else 'WRONG'}")


def with_node(tmp: Path, name: str, env: dict[str, str],
              work: Callable[[Node], Awaitable[None]]) -> None:
    node = Node(tmp / f"{name}.log", AENV_PRIMED_POOL_SIZE="0", **env)
    node.start()
    try:
        sdk_env(node)
        asyncio.run(work(node))
    finally:
        node.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--delays", default="0,2,10", help="release delays (s) for the turn loop")
    ap.add_argument("--cpu-window", type=float, default=60.0)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--sandboxes", type=int, default=16)
    ap.add_argument("--skip-loop", action="store_true")
    args = ap.parse_args()
    res: Rows = defaultdict(list)
    info: dict[str, str] = {}
    loops = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        hot_env = {"AENV_HOT_RELEASE_DELAY_S": "2", "AENV_MAX_CONCURRENT_BOOTS": "16"}
        with_node(tmp, "hot", hot_env,
                  lambda node: hot_rows(node, args.n, args.cpu_window, res, info))
        pause_limits(tmp / "hot.log", args.n, res)
        with_node(tmp, "fork", hot_env, lambda node: fork_rows(node, args.n, res, info))
        with_node(tmp, "cold", {"AENV_HOT_PAUSE_S": "0"}, lambda node: cold_rows(args.n, res))
        asyncio.run(raw_rows(args.n, res))
        if not args.skip_loop:
            for d in args.delays.split(","):
                out: dict[str, Any] = {}

                async def loop(node: Node, out: dict[str, Any] = out) -> None:
                    out["steady"] = await turn_loop(args.sandboxes, args.turns, pause=False)
                    out["paused"] = await turn_loop(args.sandboxes, args.turns, pause=True)

                with_node(tmp, f"loop{d}", {**hot_env, "AENV_HOT_RELEASE_DELAY_S": d}, loop)
                (s, _), (p, ok) = out["steady"], out["paused"]
                loops.append((f"{d} s", pct(p, 50), pct(p, 95), pct(s, 50), pct(s, 95), ok))
    table(res, info, loops)


if __name__ == "__main__":
    main()
