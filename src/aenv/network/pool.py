"""A pool of network slots: index allocation, reuse of released slots, crash cleanup.

Creating a slot costs ~8 ms and destroying one ~35 ms (the kernel waits for RCU grace
periods when links go away), while resetting a released one costs ~2 ms, so released
slots are kept and handed out again. Everything aenv creates is named after the pool's
prefix, which is how a census or start-up reconciliation finds leftovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from aenv.network import netns as ns
from aenv.network.addressing import DEFAULT_NETWORK, DEFAULT_PREFIX, SlotNaming
from aenv.network.slot import Slot, create_slot, destroy_slot, reset_slot, slot_for

log = logging.getLogger(__name__)

DEFAULT_UID_BASE = 880000  # matches Config.jail_uid_base
HOST_LOCK = Path("/run/aenv/slots.lock")


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """Serialises slot creation among all node processes on this host (flock: released if
    the process dies)."""
    HOST_LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def default_uid_for_index(index: int) -> int:
    return DEFAULT_UID_BASE + index


class SlotPoolError(RuntimeError):
    pass


class SlotPoolExhausted(SlotPoolError):
    """Every index up to max_slots is in use (or blocked by an un-reclaimed leftover)."""


def _host_link_names() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def _link_exists(name: str) -> bool:
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


def address_is_local(addr: str) -> bool:
    """Whether addr is assigned to a host interface: binding succeeds only for local
    addresses (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((addr, 0))
        except OSError:
            return False
    return True


def list_owned(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Names of slot namespaces with this prefix that exist on the host, ours or leftovers."""
    naming = SlotNaming(prefix)
    return [n for n in ns.list_netns(prefix) if naming.netns_index(n) is not None]


def reclaim_orphans(prefix: str = DEFAULT_PREFIX, keep: Iterable[str] = ()) -> list[str]:
    """Delete slot namespaces and host veths with this prefix except those of the netns
    names in keep (slots a live pool or sandbox still owns). Returns what was removed.
    Call from the host namespace (any ordinary thread)."""
    naming = SlotNaming(prefix)
    keep = set(keep)
    removed: list[str] = []
    for name in list_owned(prefix):
        if name in keep:
            continue
        index = naming.netns_index(name)
        assert index is not None
        destroy_slot(name, naming.host_veth(index))
        removed.append(name)
    # Host veths whose namespace is already gone (e.g. the mount vanished with a reboot
    # of /run but the link did not, or a crash between the two).
    for link in _host_link_names():
        index = naming.veth_index(link)
        if index is None or naming.netns(index) in keep:
            continue
        destroy_slot(naming.netns(index), link)
        removed.append(link)
    if removed:
        log.info("reclaimed leftover network slots: %s", ", ".join(removed))
    return removed


class SlotPool:
    """Hands out slots; thread-safe. The *_async methods run the blocking work in a thread
    for callers on an event loop.

    uid_for_index gives the owner of each slot's tap: the jail runs the slot's VMM as that
    uid, so a slot keeps the same uid across reuse.
    """

    def __init__(
        self,
        *,
        prefix: str = DEFAULT_PREFIX,
        network: str = DEFAULT_NETWORK,
        max_slots: int = 4096,
        uid_for_index: Callable[[int], int] = default_uid_for_index,
        max_idle: int | None = None,
    ) -> None:
        self.naming = SlotNaming(prefix, network)
        if not 0 < max_slots <= self.naming.capacity:
            raise ValueError(f"max_slots must be 1..{self.naming.capacity} for {network}")
        self.max_slots = max_slots
        self.uid_for_index = uid_for_index
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: deque[Slot] = deque()
        self._in_use: dict[int, Slot] = {}
        self._busy: set[int] = set()  # being created or destroyed
        self._closed = False
        self._warned: set[int] = set()  # leftover indices already logged

    @property
    def prefix(self) -> str:
        return self.naming.prefix

    # -- bookkeeping ------------------------------------------------------------------

    def _reserve_index(self) -> int:
        """Lowest index not used by us and not blocked by a leftover (called under lock)."""
        taken = set(self._in_use) | self._busy | {s.index for s in self._idle}
        for index in range(self.max_slots):
            if index in taken:
                continue
            # A leftover from a crash (or another process using the same prefix): skip it
            # rather than fail; reclaim_orphans at start-up gets the index back.
            blocked = (
                os.path.lexists(ns.netns_path(self.naming.netns(index)))
                or _link_exists(self.naming.host_veth(index))
                # Someone else (another pool or process with another prefix) already uses
                # this /30 on the host: two routes for it would break both slots.
                or address_is_local(self.naming.host_addr(index))
            )
            if blocked:
                if index not in self._warned:
                    self._warned.add(index)
                    log.warning("slot index %d blocked by a leftover, skipping it", index)
                continue
            self._busy.add(index)
            return index
        raise SlotPoolExhausted(f"no free network slot (max_slots={self.max_slots})")

    def owned(self) -> set[str]:
        """Namespace names this pool holds (in use, idle, or being created or destroyed):
        the keep set for a census (a warm pool may be creating slots while it runs)."""
        with self._lock:
            return {s.netns for s in (*self._in_use.values(), *self._idle)} | {
                self.naming.netns(i) for i in self._busy}

    def holds(self, slot: Slot) -> bool:
        """Whether slot is currently handed out (not idle, not destroyed)."""
        with self._lock:
            return self._in_use.get(slot.index) is slot

    @property
    def in_use(self) -> int:
        with self._lock:
            return len(self._in_use)

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    # -- operations -------------------------------------------------------------------

    def _create(self) -> Slot:
        """Create a slot at a freshly reserved index; the caller files it under the lock.
        Other node processes (instances) on this host pick indexes from the same address
        range, and an index is seen as taken only once its slot exists: choosing and
        creating happen under one host-wide lock."""
        with _host_lock():
            with self._lock:
                if self._closed:
                    raise SlotPoolError("slot pool is closed")
                index = self._reserve_index()
            slot = slot_for(self.naming, index, self.uid_for_index(index))
            try:
                create_slot(slot)
            except BaseException:
                with self._lock:
                    self._busy.discard(index)
                raise
        return slot

    def _destroy(self, slot: Slot) -> None:
        """Destroy a slot that is no longer filed anywhere; its index stays reserved until
        the links are gone so nobody recreates the same names meanwhile."""
        with self._lock:
            self._busy.add(slot.index)
        try:
            destroy_slot(slot.netns, slot.host_veth)
        finally:
            with self._lock:
                self._busy.discard(slot.index)

    def acquire(self) -> Slot:
        with self._lock:
            if self._closed:
                raise SlotPoolError("slot pool is closed")
            if self._idle:
                slot = self._idle.pop()  # most recently used first
                self._in_use[slot.index] = slot
                return slot
        slot = self._create()
        with self._lock:
            self._busy.discard(slot.index)
            if not self._closed:
                self._in_use[slot.index] = slot
                return slot
        self._destroy(slot)
        raise SlotPoolError("slot pool is closed")

    def adopt(self, index: int) -> Slot:
        """Claim the slot at `index` as it is: one an earlier process with this prefix
        created and a VMM it left running still uses (node restart). It is marked in use,
        neither created nor reset, and goes back through `release` like any other."""
        slot = slot_for(self.naming, index, self.uid_for_index(index))
        with self._lock:
            if self._closed:
                raise SlotPoolError("slot pool is closed")
            if not 0 <= index < self.max_slots:
                raise SlotPoolError(f"slot index {index} is outside max_slots={self.max_slots}")
            if index in self._in_use or index in self._busy or any(
                    s.index == index for s in self._idle):
                raise SlotPoolError(f"slot {slot.netns} is already held by this pool")
            if not slot.netns_path.exists() or not _link_exists(slot.host_veth):
                raise SlotPoolError(f"slot {slot.netns} does not exist (or is half gone)")
            self._in_use[index] = slot
        return slot

    def release(self, slot: Slot) -> None:
        """Return a slot (its VMM must be gone). It is reset and kept for reuse, or
        destroyed if the pool is closed, full of idle slots, or the reset fails."""
        with self._lock:
            if self._closed and slot.index not in self._in_use:
                return  # close() already destroyed it
            if self._in_use.get(slot.index) != slot:
                raise ValueError(f"slot {slot.netns} is not in use in this pool")
            del self._in_use[slot.index]
            keep = not self._closed and (self.max_idle is None or len(self._idle) < self.max_idle)
            if keep:
                self._busy.add(slot.index)
        if keep:
            try:
                reset_slot(slot)
            except Exception:
                log.exception("resetting slot %s failed; destroying it", slot.netns)
                keep = False
            with self._lock:
                self._busy.discard(slot.index)
                if keep and not self._closed:
                    self._idle.append(slot)
                    return
        self._destroy(slot)

    def prewarm(self, count: int) -> int:
        """Create idle slots until `count` are idle (bounded by max_slots). Returns how many
        were created."""
        created = 0
        while True:
            with self._lock:
                if self._closed or len(self._idle) >= count:
                    return created
            try:
                slot = self._create()
            except SlotPoolExhausted:
                return created
            with self._lock:
                self._busy.discard(slot.index)
                if not self._closed:
                    self._idle.append(slot)
                    created += 1
                    continue
            self._destroy(slot)
            return created

    def close(self) -> None:
        """Destroy every slot this pool holds, idle or in use. Idempotent."""
        with self._lock:
            self._closed = True
            slots = [*self._idle, *self._in_use.values()]
            self._idle.clear()
            self._in_use.clear()
        errors: list[BaseException] = []
        for slot in slots:
            try:
                self._destroy(slot)
            except Exception as e:  # keep going: leave as little behind as possible
                log.exception("destroying slot %s failed", slot.netns)
                errors.append(e)
        if errors:
            raise SlotPoolError(f"{len(errors)} slot(s) could not be destroyed") from errors[0]

    # -- asyncio ----------------------------------------------------------------------

    async def acquire_async(self) -> Slot:
        fut = asyncio.ensure_future(asyncio.to_thread(self.acquire))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            # The thread keeps running; give back what it acquires instead of leaking it.
            fut.add_done_callback(self._release_abandoned)
            raise

    def _release_abandoned(self, fut: asyncio.Future[Slot]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        threading.Thread(target=self.release, args=(fut.result(),), daemon=True).start()

    async def release_async(self, slot: Slot) -> None:
        await asyncio.to_thread(self.release, slot)

    async def prewarm_async(self, count: int) -> int:
        return await asyncio.to_thread(self.prewarm, count)

    async def close_async(self) -> None:
        await asyncio.to_thread(self.close)
