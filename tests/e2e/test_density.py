"""Density (issue 30): sandboxes of one snapshot share its clean pages, and what each one
writes stays its own through pause, resume, fork and snapshot (vmm/ram.py); an idle one
hands back what it wrote (machines/reclaiming.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2b import Sandbox

from aenv.storage.checksums import sha256_file
from aenv.storage.templates import TemplateCatalog
from tests.support.host import DATA_DIR, qemu_pids, vmm_of

from .conftest import NodeProcess, free_port, running_node, start_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _sh(sbx: Sandbox, cmd: str) -> str:
    r = sbx.commands.run(cmd, user="root", timeout=120)
    assert r.exit_code == 0, r.stderr
    return r.stdout.strip()


def _mark(sbx: Sandbox, who: str) -> None:
    """A file on its disk and a counter in its RAM only (tmpfs)."""
    _sh(sbx, f"echo {who} > /home/user/who && echo 1 > /dev/shm/counter")


def _seen(sbx: Sandbox) -> tuple[str, str]:
    return (_sh(sbx, "cat /home/user/who 2>/dev/null || echo none"),
            _sh(sbx, "cat /dev/shm/counter 2>/dev/null || echo none"))


def _bump(sbx: Sandbox) -> None:
    _sh(sbx, "echo $(( $(cat /dev/shm/counter) + 1 )) > /dev/shm/counter")


def _fork(node: NodeProcess, parent: Sandbox) -> Sandbox:
    """One fork child of `parent` (aenv's POST /sandboxes/{id}/fork), connected."""
    with node.api() as api:
        r = api.post(f"/sandboxes/{parent.sandbox_id}/fork", json={"count": 1})
        assert r.status_code in (200, 201), r.text
    return Sandbox.connect(r.json()[0]["sandbox"]["sandboxID"], timeout=600)


def _ram(instance: str, sid: str) -> tuple[int, int, int]:
    """(Rss, Pss, Anonymous) bytes of the sandbox's guest-RAM mapping, from its smaps."""
    vmm = vmm_of(instance, sid)
    assert vmm is not None, f"no VMM maps the RAM of {sid}"
    got = {"Rss:": 0, "Pss:": 0, "Anonymous:": 0}
    inside = False
    for line in Path(f"/proc/{vmm.pid}/smaps").read_text().splitlines():
        key = line.split(maxsplit=1)[0]
        if "-" in key and not key.endswith(":"):  # a VMA's head: is it inside guest RAM?
            lo, hi = (int(x, 16) for x in key.split("-"))
            inside = vmm.start <= lo and hi <= vmm.end
        elif inside and key in got:
            got[key] += int(line.split()[1]) << 10
    return got["Rss:"], got["Pss:"], got["Anonymous:"]


def test_clean_pages_are_shared_and_writes_stay_own(node: NodeProcess) -> None:
    instance = node.env["AENV_INSTANCE"]
    snap = TemplateCatalog(DATA_DIR / "templates").get("base").snapshot_id
    template_ram = DATA_DIR / "snapshots" / snap / "memory"
    before = sha256_file(template_ram)
    boxes = [Sandbox.create("base", timeout=300) for _ in range(4)]
    extra: list[Sandbox] = []
    snapshot_id = None
    try:
        for i, b in enumerate(boxes):
            _mark(b, f"box{i}")
        # One inode for all four (one page cache), and measured: the summed PSS of their RAM
        # mappings is well under their summed RSS (unshared pages count whole in both).
        inode = template_ram.stat().st_ino
        for b in boxes:
            vm = (DATA_DIR / "sandboxes" / instance / b.sandbox_id).resolve()
            assert (vm / "memory").stat().st_ino == inode
        held = [_ram(instance, b.sandbox_id) for b in boxes]
        rss, pss = sum(h[0] for h in held), sum(h[1] for h in held)
        assert all(h[2] > 0 for h in held), held  # each wrote pages of its own
        assert pss < 0.6 * rss, f"PSS {pss >> 20} MiB of RSS {rss >> 20} MiB: not shared"

        a, b, c, d = boxes
        # Pause (writes A's pages into a file of its own) and resume.
        a.pause()
        a = Sandbox.connect(a.sandbox_id, timeout=300)
        assert _seen(a) == ("box0", "1")
        # Resumed, it still reads what it did not write from the template's file (its base),
        # shared with the others: its written pages come from a file of its own.
        vm_a = (DATA_DIR / "sandboxes" / instance / a.sandbox_id).resolve()
        assert (vm_a / "memory.base").stat().st_ino == inode
        assert (vm_a / "memory").stat().st_ino != inode
        rss_a, pss_a, _ = _ram(instance, a.sandbox_id)
        assert pss_a < 0.8 * rss_a, (pss_a, rss_a)
        _bump(a)
        # Fork: the child starts from A's state; its writes are its own, and A's its own.
        kid = _fork(node, a)
        extra.append(kid)
        assert _seen(kid) == ("box0", "2")
        _mark(kid, "kid")
        _bump(a)
        assert _seen(kid) == ("kid", "1") and _seen(a) == ("box0", "3")
        with node.api() as api:
            # Snapshot of B, and a sandbox made from it.
            r = api.post(f"/sandboxes/{b.sandbox_id}/snapshots", json={})
            assert r.status_code in (200, 201), r.text
            snapshot_id = r.json()["snapshotID"]
        _bump(b)
        from_b = Sandbox.create(snapshot_id, timeout=300)
        extra.append(from_b)
        assert _seen(from_b) == ("box1", "1")
        _mark(from_b, "from-b")
        assert _seen(b) == ("box1", "2")
        # The siblings never saw any of it, nor does a new sandbox of the template.
        assert _seen(c) == ("box2", "1") and _seen(d) == ("box3", "1")
        fresh = Sandbox.create("base", timeout=300)
        extra.append(fresh)
        assert _seen(fresh) == ("none", "none")
    finally:
        for s in (*boxes, *extra):
            s.kill()
        if snapshot_id:
            with node.api() as api:
                api.delete(f"/templates/{snapshot_id}")
    assert sha256_file(template_ram) == before, "the template's RAM file changed"


def test_an_idle_sandbox_hands_back_what_it_wrote(tmp_path: Path) -> None:
    with running_node(tmp_path, AENV_RECLAIM_IDLE_S="2") as n:
        instance = n.env["AENV_INSTANCE"]
        sbx = Sandbox.create("base", timeout=300)
        try:
            digest = _sh(sbx, "head -c 32M /dev/urandom > /dev/shm/big && "
                              "md5sum /dev/shm/big | cut -d' ' -f1")  # fmt: skip
            _sh(sbx, "(sleep 1000 </dev/null >/dev/null 2>&1 &) ; sync")
            own = _ram(instance, sbx.sandbox_id)[2]
            assert own >= 32 << 20, own
            # No request for 2 s: its written pages go to its RAM file and out of memory. The
            # event is logged once the guest runs again, a moment after its memory drops.
            deadline = time.monotonic() + 30
            while ((own := _ram(instance, sbx.sandbox_id)[2]) > 8 << 20
                   or "sandbox.reclaimed" not in n.log.read_text()):
                assert time.monotonic() < deadline, f"{own >> 20} MiB of its own; logged?"
                time.sleep(0.5)
            # Nothing lost: its memory and its processes are as they were.
            assert _sh(sbx, "md5sum /dev/shm/big | cut -d' ' -f1") == digest
            assert _sh(sbx, "pgrep -x sleep >/dev/null && echo alive") == "alive"
            # A guest busy on its own (a job, no requests) is not idle: not reclaimed again.
            _sh(sbx, "(while :; do :; done </dev/null >/dev/null 2>&1 &) ; echo started")
            time.sleep(8)  # 4 rounds past its 2 s
            assert n.log.read_text().count(f"sandbox.reclaimed sandbox_id={sbx.sandbox_id}") == 1
        finally:
            sbx.kill()


def test_a_create_past_what_the_node_holds_is_429_and_leaves_nothing(tmp_path: Path) -> None:
    # A budget of 150 MiB: the first sandbox fits its estimate (a quarter of 512 MiB); once
    # it has written 64 MiB and is measured (over 100 MiB held), a second one, estimated at
    # what the first holds, does not. (An idle `base` holds ~55 MiB: two would fit.)
    with running_node(tmp_path, AENV_MEMORY_BUDGET_MIB="150", AENV_MEMORY_OVERCOMMIT="10",
                      AENV_METRICS_INTERVAL_S="1") as n:  # fmt: skip
        instance = n.env["AENV_INSTANCE"]
        sbx = Sandbox.create("base", timeout=300)
        try:
            _sh(sbx, "head -c 64M /dev/urandom > /dev/shm/fill")
            with n.api() as api:
                # GET shows what it holds, measured.
                info = api.get(f"/sandboxes/{sbx.sandbox_id}").json()["hostMemory"]
                assert 0 < info["sharedMiB"] + info["ownMiB"] <= info["residentMiB"] + 1
                assert info["pssMiB"] > 0
                time.sleep(2.5)  # measured by the sampler
                vms = qemu_pids(instance)
                r = api.post("/sandboxes", json={"templateID": "base", "timeout": 60})
                assert r.status_code == 429, r.text
                assert r.headers.get("retry-after") == "5"
                body = r.json()
                assert body["code"] == 429 and "budget of 150 MiB" in body["message"], body
                assert [s["sandboxID"] for s in api.get("/v2/sandboxes").json()] == [
                    sbx.sandbox_id]
                assert qemu_pids(instance) == vms
                assert "aenv_sandbox_memory_bytes" in api.get("/metrics").text
        finally:
            sbx.kill()


def test_under_pressure_an_idle_sandbox_is_reclaimed_before_a_create_is_refused(
        tmp_path: Path) -> None:
    # A holds ~280 MiB once it wrote 160 MiB (PSS: its pages, its share of the template's,
    # QEMU's own); a create would take the node to twice that, past 400 MiB. Reclaimed, A
    # holds ~120 MiB and B fits. The idle timer alone would take an hour.
    with running_node(tmp_path, AENV_MEMORY_BUDGET_MIB="400", AENV_MEMORY_OVERCOMMIT="10",
                      AENV_RECLAIM_IDLE_S="3600", AENV_PRIMED_POOL_SIZE="0",
                      AENV_METRICS_INTERVAL_S="1") as n:  # fmt: skip
        a = Sandbox.create("base", timeout=300)
        b = None
        try:
            digest = _sh(a, "head -c 160M /dev/urandom > /dev/shm/big && "
                            "md5sum /dev/shm/big | cut -d' ' -f1")  # fmt: skip
            time.sleep(6)  # past PRESSURE_IDLE_S with no request
            b = Sandbox.create("base", timeout=300)
            log = n.log.read_text()
            assert "sandbox.reclaimed" in log and "reason=pressure" in log, log[-3000:]
            assert _sh(a, "md5sum /dev/shm/big | cut -d' ' -f1") == digest
            assert _sh(b, "echo ok") == "ok"
        finally:
            a.kill()
            if b is not None:
                b.kill()


def test_writes_stay_own_through_a_node_kill_9_and_its_readoption(
        tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Running sandboxes (one a fork child sharing its parent's pages) are re-adopted by
    # the next node process; a hot-paused one resumes cold from its files. Each keeps its
    # own counter (RAM) and file (disk), and saves after the adoption are whole.
    snap = TemplateCatalog(DATA_DIR / "templates").get("base").snapshot_id
    template_ram = DATA_DIR / "snapshots" / snap / "memory"
    before = sha256_file(template_ram)
    port = free_port()
    a = start_node(tmp_path / "a.log", instance, monkeypatch, port)
    b = None
    boxes: list[Sandbox] = []
    try:
        try:
            x, y = Sandbox.create("base", timeout=600), Sandbox.create("base", timeout=600)
            boxes += [x, y]
            _mark(x, "x")
            _mark(y, "y")
            _bump(x)
            kid = _fork(a, x)
            boxes.append(kid)
            assert _seen(kid) == ("x", "2")
            _mark(kid, "kid")
            _bump(x)
            assert y.pause()  # hot: its VMM outlives the node, the next one ends it
        finally:
            a.kill9()
        b = start_node(tmp_path / "b.log", instance, monkeypatch, port)
        done = [ln for ln in b.tail(400).splitlines() if "recovery.done" in ln]
        assert done and "adopted=2" in done[-1], done  # x and its child: the same VMMs
        assert _seen(x) == ("x", "3") and _seen(kid) == ("kid", "1"), b.tail()
        y = Sandbox.connect(y.sandbox_id, timeout=600)
        assert _seen(y) == ("y", "1")
        for s in (x, kid, y):
            _bump(s)
        # A save of an adopted VM (pause, resume) keeps what it holds.
        assert x.pause()
        x = Sandbox.connect(x.sandbox_id, timeout=600)
        assert _seen(x) == ("x", "4") and _seen(kid) == ("kid", "2") and _seen(y) == ("y", "2")
    finally:
        if b is None:
            b = start_node(tmp_path / "b.log", instance, monkeypatch, port)
        for s in boxes:
            s.kill()
        code = b.stop()
    assert code == 0, b.tail()
    assert sha256_file(template_ram) == before, "the template's RAM file changed"
