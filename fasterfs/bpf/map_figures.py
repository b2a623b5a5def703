"""What the programs' own maps say, as KernelPrograms.snapshot shows it: the global counters,
each watched port's requests and latency, and SOCK_OPS's connections and options."""
from __future__ import annotations

import collections

from . import events as ev
from .events import hist_quantile

QUICKACK_NOTE = ("TCP_QUICKACK cannot be set from BPF (the kernel answers -EINVAL); delayed ACKs are "
                 "capped with TCP_BPF_DELACK_MAX instead")


def counters(bpf) -> dict[str, int]:
    return {ev.COUNTERS[k.value]: v.value for k, v in bpf[b"counters"].items()}


def ports(bpf) -> dict[int, dict]:
    """Per port: requests by method and the latency histogram (log2 µs slots) with its quantiles."""
    hist: dict[int, dict[int, int]] = collections.defaultdict(dict)
    for k, v in bpf[b"latency_hist"].items():
        hist[k.port][k.slot] = v.value
    out = {}
    for k, v in bpf[b"port_stats"].items():
        h = hist.get(k.value, {})
        out[k.value] = {
            "requests": v.requests, "gets": v.gets, "puts": v.puts, "deletes": v.deletes,
            "latency_count": v.lat_count,
            "latency_avg_us": v.lat_sum_ns / v.lat_count / 1000 if v.lat_count else None,
            "latency_p50_us": hist_quantile(h, 0.5), "latency_p99_us": hist_quantile(h, 0.99),
            "latency_hist_log2_us": {str(s): c for s, c in sorted(h.items())},
        }
    return out


def sockops(bpf) -> dict:
    """Connections seen and tuned, and each option's successes and failures."""
    options = {ev.SOCKOPTS[k.value]: {"ok": v.ok, "fail": v.fail, "last_error": v.last_error or None}
               for k, v in bpf[b"sockopt_stats"].items()}
    sock = {ev.SOCK_COUNTERS[k.value]: v.value for k, v in bpf[b"sock_counters"].items()}
    return {**sock, "options": options, "note": QUICKACK_NOTE}
