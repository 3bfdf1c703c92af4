"""Bringing the AF_XDP carrier up: the XDP program loaded and attached, its AF_XDP sockets
open (``open_xdp``), and the kernel's copy of the keys published into its maps
(``publish_keys``). The daemon's start calls both once the model is up, and the operator's
`xdp-attach` again later; what a request or a keys file is stays above this package, which
is handed only the derived tag keys and a way to ask which ones running requests hold.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import NetworkSection
    from ..ops.logs import Log
    from .carrier_metrics import CarrierMetrics
    from .xdp_io import XdpIO


def open_xdp(n: NetworkSection, port: int, metrics: CarrierMetrics, log: Log,
             ingress: str | None = None) -> XdpIO | None:
    """The AF_XDP fast path (network.ingress xdp|auto; `ingress` overrides it for the
    operator's `xdp-attach`). The UDP socket stays open either way: it serves whatever
    the XDP program passes on (no socket registered yet, another device, a host without
    XDP), so both paths always answer."""
    ingress = ingress or n.ingress
    if ingress not in ("udp", "xdp", "auto"):
        raise ValueError(f"network.ingress must be udp, xdp or auto, not {ingress!r}")
    if ingress == "udp":
        return None
    if not n.interface:
        if ingress == "xdp":
            raise ValueError("network.ingress = xdp needs network.interface")
        log("ingress auto: no network.interface set, using udp")
        return None
    from .xdp_io import XdpIO, XdpSettings
    try:
        io = XdpIO.open(XdpSettings(n.interface, (port,), attach_mode=n.xdp_attach,
                                    xsk_mode=n.xsk_mode, ring_size=n.xsk_ring_size,
                                    rate_pps=n.xdp_rate_pps, rate_burst=n.xdp_rate_burst,
                                    untagged_pps=n.xdp_untagged_pps,
                                    untagged_burst=n.xdp_untagged_burst,
                                    pin_dir=n.xdp_pin_dir))
    except (OSError, RuntimeError, ValueError) as e:
        if ingress == "xdp":
            raise OSError(f"XDP ingress on {n.interface}: {e}") from e
        log(f"ingress auto: XDP unavailable on {n.interface} ({e}); using udp",
            logging.WARNING)
        return None
    log(f"XDP attached to {n.interface} ({n.xdp_attach}), {len(io.socks)} AF_XDP socket(s), "
        f"{'zero-copy' if io.zerocopy else 'copy mode'}; BCC compile (helper process) "
        f"{io.compile_seconds:.2f} s" + (f"; maps pinned in {n.xdp_pin_dir}" if io.pins else ""))
    metrics.xdp_attached.set(1)
    return io


def publish_keys(io: XdpIO, xdp_keys: dict[int, bytes], skew_s: float, require_tag: bool,
                 running: Callable[[], dict[int, list[bytes]]]) -> None:
    """Give the XDP program the key ids, their XDP tag keys and the clock, and turn its
    checks on (docs/PROTOCOL.md §10). Until this runs they are off: the program is then
    lenient, never stricter than the daemon. Again after xdp-attach's hand-over (a reload
    may have come between). `running`: key id -> the tag keys of requests running under it
    (a key the file lost stays in the kernel, retired, while one of them runs)."""
    from zerolayer.bpf.kernel_keys import KernelKeys
    if io.auth is None:
        io.auth = KernelKeys(io.prog, skew_s=skew_s, require_tag=require_tag, running=running)
    io.auth.publish(xdp_keys)
