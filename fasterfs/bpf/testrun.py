"""BPF_PROG_TEST_RUN for SCHED_CLS programs: run a loaded program on a crafted packet.

bcc 0.26 has no wrapper for it, so this calls libbpf's bpf_prog_test_run_opts through
ctypes (Debian's libbpf1). Used by the tests and the overhead benchmark.
"""
from __future__ import annotations

import ctypes as ct
import ipaddress
import os
import struct

from .libbpf import lib


class _TestRunOpts(ct.Structure):  # struct bpf_test_run_opts, libbpf >= 0.7
    _fields_ = [("sz", ct.c_size_t), ("data_in", ct.c_void_p), ("data_out", ct.c_void_p),
                ("data_size_in", ct.c_uint32), ("data_size_out", ct.c_uint32),
                ("ctx_in", ct.c_void_p), ("ctx_out", ct.c_void_p),
                ("ctx_size_in", ct.c_uint32), ("ctx_size_out", ct.c_uint32),
                ("retval", ct.c_uint32), ("repeat", ct.c_int), ("duration", ct.c_uint32),
                ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32)]


# struct __sk_buff is 192 bytes; `mark` is its third u32 (len, pkt_type, mark).
SKB_SIZE, SKB_MARK_OFFSET = 192, 8

_ready = False


def _libbpf():
    global _ready
    handle = lib()
    if not _ready:
        handle.bpf_prog_test_run_opts.argtypes = [ct.c_int, ct.POINTER(_TestRunOpts)]
        handle.bpf_prog_test_run_opts.restype = ct.c_int
        _ready = True
    return handle


def run(prog_fd: int, packet: bytes, repeat: int = 1, mark: int = 0) -> tuple[int, int]:
    """Run the program on `packet`; returns (return value, average ns per run)."""
    data = ct.create_string_buffer(packet, len(packet))
    ctx = ct.create_string_buffer(SKB_SIZE)
    struct.pack_into("<I", ctx, SKB_MARK_OFFSET, mark)
    opts = _TestRunOpts(sz=ct.sizeof(_TestRunOpts), data_in=ct.cast(data, ct.c_void_p), data_size_in=len(packet),
                        ctx_in=ct.cast(ctx, ct.c_void_p), ctx_size_in=SKB_SIZE, repeat=repeat)
    if _libbpf().bpf_prog_test_run_opts(prog_fd, ct.byref(opts)) != 0:
        err = ct.get_errno()
        raise OSError(err, f"bpf_prog_test_run_opts: {os.strerror(err)}")
    return ct.c_int32(opts.retval).value, opts.duration


def tcp_packet(src: str, dst: str, sport: int, dport: int, payload: bytes, seq: int = 1) -> bytes:
    """An Ethernet + IPv4/IPv6 + TCP packet carrying `payload` (checksums left zero)."""
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, 0x18, 65535, 0, 0) + payload
    if s.version == 4:
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, s.packed, d.packed)
        ethertype = 0x0800
    else:
        ip = struct.pack("!IHBB16s16s", 6 << 28, len(tcp), 6, 64, s.packed, d.packed)
        ethertype = 0x86DD
    return b"\x00" * 12 + struct.pack("!H", ethertype) + ip + tcp
