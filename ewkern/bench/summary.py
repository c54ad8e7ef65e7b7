"""The markdown summary of a run (printed at the end and saved as summary.md)."""

from __future__ import annotations

from .units import fmt_bytes

__all__ = ["markdown", "md_table", "fmt_gbs", "fmt_pct"]


def md_table(headers, rows) -> str:
    def cell(v):
        return "-" if v is None else str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def fmt_gbs(v):
    return "-" if v is None else f"{v:.1f}"


def fmt_pct(v):
    return "-" if v is None else f"{v:.0f}%"


def markdown(results: dict) -> str:
    from . import registry
    info = results.get("device_info") or {}
    ref = results.get("reference") or {}
    vers = results.get("versions") or {}
    git = results.get("git") or {}
    out = [f"# ewkern.bench: {results.get('device_name') or results.get('device')}"
           + (" (PARTIAL: interrupted or incomplete)" if results.get("partial") else ""), ""]
    facts = [("device", f"{results.get('device')} ({info.get('name')})"),
             ("cache mode", results.get("cache")),
             ("quick", results.get("quick")),
             ("theoretical peak", f"{results['peak_gbs']:.0f} GB/s" if results.get("peak_gbs") else "n/a (no GPU memory attributes)"),
             ("measured copy", f"{ref['copy_gbs']:.1f} GB/s ({fmt_bytes(ref.get('size_bytes'))} float32, {ref.get('cache')})"
              if ref.get("copy_gbs") else ref.get("error", "not measured")),
             ("L2 / last-level cache", fmt_bytes(info.get("l2_bytes") or results.get("cache_bytes"))),
             ("versions", ", ".join(f"{k} {v}" for k, v in vers.items() if v)),
             ("git", f"{(git.get('commit') or '?')[:12]}{' (dirty)' if git.get('dirty') else ''}"),
             ("started", results.get("started")), ("elapsed", f"{results.get('elapsed_s', 0):.1f} s")]
    out.append(md_table(["", ""], facts))
    out.append("")
    if results.get("parts"):   # a merge of runs made in parts (ewkern.bench.merge)
        out.append("Merged from runs made in parts (the table above is the first part's):")
        out.append("")
        out.append(md_table(["part", "experiments", "git", "started"],
                            [[str(i + 1), ", ".join(p.get("experiments") or []),
                              ((p.get("git") or {}).get("commit") or "?")[:12], p.get("started")]
                             for i, p in enumerate(results["parts"])]))
        out.append("")
        for note in results.get("notes") or []:
            out.append(f"- {note}")
        out.append("")
    out.append("Bandwidth = (bytes read + bytes written) / median time per launch (A1: 3*n*4 B / t). "
               "Every number names its cache mode.")
    for name, exp in (results.get("experiments") or {}).items():
        out += ["", f"## {name}: {exp.get('title')}", ""]
        status = exp.get("status")
        if status != "ok":
            out.append(f"**{status}**" + (f": {exp.get('reason')}" if exp.get("reason") else ""))
            out.append("")
        for note in exp.get("notes") or []:
            out.append(f"- {note}")
        if exp.get("notes"):
            out.append("")
        try:
            spec = registry.get(name)
            text = spec.summary(results, exp) if (exp.get("measurements") or exp.get("tables")) else ""
        except Exception as exc:
            text = f"(summary failed: {type(exc).__name__}: {exc})"
        if text:
            out.append(text)
        skipped = exp.get("skipped") or []
        if skipped:
            reasons = {}
            for s in skipped:
                reasons.setdefault(s["reason"], []).append(s["what"])
            out.append("")
            out.append("Skipped: " + "; ".join(
                f"{', '.join(w[:4])}{' and %d more' % (len(w) - 4) if len(w) > 4 else ''} ({r})"
                for r, w in reasons.items()))
        for e in exp.get("errors") or []:
            out.append(f"\nERROR in {e['what']}: {e['error']}")
    claims = results.get("claims") or []
    if claims:
        out += ["", "## Claims", "",
                md_table(["claim", "paper", "verdict", "evidence"],
                         [(c.get("claim"), c.get("source"), c.get("status"), c.get("evidence")) for c in claims])]
    return "\n".join(out) + "\n"
