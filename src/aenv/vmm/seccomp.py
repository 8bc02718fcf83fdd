"""A seccomp filter the jail installs before exec: `madvise(MADV_HUGEPAGE)` becomes a no-op.

Why: QEMU marks all guest RAM MADV_HUGEPAGE. Guest RAM is a shared file on the data fs,
and on a VM_HUGEPAGE mapping the page cache faults it in as 2 MiB folios, so a guest
that dirties one 4 KiB page makes 2 MiB dirty and pause writes it all (measured: a 1 GiB
guest that dirtied 10 MiB wrote 76-83 MiB on pause; 64 scattered 4 KiB writes flush
63 MiB instead of 257 KiB). `prctl(PR_SET_THP_DISABLE)` does not help: file readahead
looks only at the VMA flag. QEMU's own `-sandbox` filter stacks on top of this one.

The filter answers 0 without running the call, so QEMU carries on as if it had worked.
x86_64 only (the syscall number and audit arch are fixed here); elsewhere nothing is
installed and pause writes whole folios.
"""

from __future__ import annotations

import ctypes
import platform
import struct
from functools import cache

_AUDIT_ARCH_X86_64 = 0xC000003E
_NR_MADVISE_X86_64 = 28
_MADV_HUGEPAGE = 14
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO_0 = 0x00050000  # SECCOMP_RET_ERRNO with errno 0: the call "succeeds"

# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6] (little-endian).
_OFF_NR, _OFF_ARCH, _OFF_ARG2_LO = 0, 4, 16 + 2 * 8
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes:
    """The BPF program: allow everything except madvise(_, _, MADV_HUGEPAGE)."""
    return b"".join([
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 0, 5, _AUDIT_ARCH_X86_64),
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
        _insn(_JEQ_K, 0, 3, _NR_MADVISE_X86_64),
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG2_LO),
        _insn(_JEQ_K, 0, 1, _MADV_HUGEPAGE),
        _insn(_RET_K, 0, 0, _RET_ERRNO_0),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
    ])  # fmt: skip


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


@cache
def _prepared() -> tuple[ctypes.CDLL, _SockFprog, ctypes.Array[ctypes.c_char]] | None:
    """Built once in the parent, so the forked child only makes one prctl call."""
    if platform.machine() != "x86_64":
        return None
    code = program()
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    return ctypes.CDLL(None, use_errno=True), prog, buf


def prepare() -> None:
    _prepared()


def install() -> None:
    """Install the filter in the calling process (a jail launcher between fork and exec).
    It needs CAP_SYS_ADMIN or no_new_privs; the launcher runs as root. Inherited by exec."""
    prepared = _prepared()
    if prepared is None:
        return
    libc, prog, _buf = prepared
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "installing the jail's seccomp filter failed")
