"""E1: the theoretical peak global-memory bandwidth from the device's own attributes.

GB/s = bus width (bytes) x transfers per cycle x memory clock (GHz), with transfers per cycle
from the memory type (GDDR6X 16, GDDR6/GDDR5X 8, SDR 1, DDR*/HBM* 2). The formula is checked
against the paper's own table (A100 80 GB 1935, A100 40 GB 1555, A10 600, L4 300 GB/s) and the
run's measured copy bandwidth is set against the device's peak.
"""

from __future__ import annotations

from .common import bars_figure, md_table
from .timing import Skip

NAME = "e1"
TITLE = "Peak global memory bandwidth from the device attributes"
DESCRIPTION = "theoretical peak GB/s = bus bytes x transfers/cycle x memory clock, vs measured copy"
PAPER = "elementwise-ops-on-gpus.md"
CPU = False
CPU_SKIP = "the formula needs a GPU's memory bus width, memory clock and memory type"

TRANSFERS_PER_CYCLE = {"GDDR6X": 16, "GDDR6": 8, "GDDR5X": 8, "SDR": 1}   # everything else: 2

# The paper's table: (name, bus bits, memory clock GHz, memory type, its GB/s)
PAPER_GPUS = [("A100 80 GB", 5120, 1.512, "HBM2E", 1935), ("A100 40 GB", 5120, 1.215, "HBM2", 1555),
              ("A10", 384, 1.5625, "GDDR6", 600), ("L4", 192, 1.5625, "GDDR6", 300)]


def transfers_per_cycle(memory_type: str | None) -> int:
    if not memory_type:
        return 2
    t = memory_type.upper().replace(" ", "")
    for key in ("GDDR6X", "GDDR5X", "GDDR6", "SDR"):
        if t.startswith(key):
            return TRANSFERS_PER_CYCLE[key]
    return 2


def peak_gbs(bus_bits: int, clock_ghz: float, transfers: int) -> float:
    return bus_bits / 8 * transfers * clock_ghz


def run(ctx, xr):
    info = ctx.info
    bus = info.get("memory_bus_width_bits")
    clock_khz = info.get("memory_clock_khz")
    if not bus or not clock_khz:
        raise Skip("device_info has no memory bus width or memory clock")
    mtype = info.get("memory_type")
    transfers = info.get("transfers_per_cycle") or transfers_per_cycle(mtype)
    ghz = clock_khz / 1e6
    ours = peak_gbs(bus, ghz, transfers)
    ref = ctx.results.get("reference") or {}
    row = {"device": info.get("name"), "memory_type": mtype, "bus_width_bits": bus,
           "memory_clock_ghz": ghz, "transfers_per_cycle": transfers, "gbps_per_pin": transfers * ghz,
           "peak_gbs_formula": ours, "peak_gbs_device_info": info.get("peak_bandwidth_gbs"),
           "measured_copy_gbs": ref.get("copy_gbs"),
           "measured_pct_of_peak": (100 * ref["copy_gbs"] / ours) if ref.get("copy_gbs") else None,
           "l2_bytes": info.get("l2_bytes"), "sm_count": info.get("sm_count")}
    xr.table("peak", [row])
    check = []
    for name, bits, clk, mt, paper in PAPER_GPUS:
        val = peak_gbs(bits, clk, transfers_per_cycle(mt))
        check.append({"gpu": name, "memory_type": mt, "bus_width_bits": bits, "memory_clock_ghz": clk,
                      "transfers_per_cycle": transfers_per_cycle(mt), "formula_gbs": round(val, 1),
                      "paper_gbs": paper})
    xr.table("formula_check", check)
    if info.get("peak_bandwidth_gbs") and abs(info["peak_bandwidth_gbs"] - ours) > 0.01 * ours:
        xr.note(f"device_info's peak {info['peak_bandwidth_gbs']:.0f} GB/s differs from the formula's "
                f"{ours:.0f} GB/s")
    if mtype is None:
        xr.note("memory type unknown: 2 transfers per cycle assumed (DDR/HBM)")


def figures(results, exp):
    rows = (exp.get("tables") or {}).get("peak") or []
    if not rows:
        return []
    r = rows[0]
    cats = ["theoretical peak", "measured copy"]
    vals = {("theoretical peak", "GB/s"): r.get("peak_gbs_formula"),
            ("measured copy", "GB/s"): r.get("measured_copy_gbs")}
    fig = bars_figure(results, cats, ["GB/s"], vals, kind="global memory",
                      subtitle=f"{r.get('memory_type') or '?'}: {r['bus_width_bits']} bit x "
                               f"{r['transfers_per_cycle']} x {r['memory_clock_ghz']:.3f} GHz",
                      lines=False)
    return [("e1_peak", fig)]


def summary(results, exp):
    t = exp.get("tables") or {}
    out = []
    for r in t.get("peak") or []:
        out.append(md_table(
            ["device", "memory", "bus bits", "clock GHz", "transfers/cycle", "Gbps", "peak GB/s",
             "device_info GB/s", "measured copy GB/s", "% of peak"],
            [[r["device"], r["memory_type"], r["bus_width_bits"], f"{r['memory_clock_ghz']:.3f}",
              r["transfers_per_cycle"], f"{r['gbps_per_pin']:.2f}", f"{r['peak_gbs_formula']:.0f}",
              f"{r['peak_gbs_device_info']:.0f}" if r.get("peak_gbs_device_info") else "-",
              f"{r['measured_copy_gbs']:.0f}" if r.get("measured_copy_gbs") else "-",
              f"{r['measured_pct_of_peak']:.0f}%" if r.get("measured_pct_of_peak") else "-"]]))
    if t.get("formula_check"):
        out.append("\nThe formula against the paper's table:\n")
        out.append(md_table(["GPU", "memory", "bus bits", "clock GHz", "transfers", "formula GB/s", "paper GB/s"],
                            [[c["gpu"], c["memory_type"], c["bus_width_bits"], c["memory_clock_ghz"],
                              c["transfers_per_cycle"], c["formula_gbs"], c["paper_gbs"]]
                             for c in t["formula_check"]]))
    return "\n".join(out)
