"""Profiler, pictures: a text timeline and a self-contained HTML timeline per NeuronCore.

Both put every kernel and DMA transfer on its core's simulated clock, in the order the device
ran them, with the line of your code that launched it; `record_function` blocks are drawn above
the kernels they cover. The HTML file is one inline SVG (no scripts, no network): open it in any
browser, hover a box for its kernel, source line and times.

>>> from eager_neuron.profiler.timeline import text_timeline
>>> text_timeline([])
'(no kernels)'
"""

from __future__ import annotations

import colorsys
import hashlib
import html

_ROW = 22           # px per lane
_LEFT = 150         # px for lane names
_WIDTH = 1400       # px of the time axis


def _device_items(events) -> list:
    return sorted((e for e in events if e.type in ("kernel", "transfer") and e.core is not None
                   and e.device_start_us is not None),
                  key=lambda e: (e.core, e.device_start_us))


def text_timeline(events, limit: int = 200) -> str:
    """One line per kernel / DMA transfer in device order: core, start and duration on the
    simulated clock, the kernel, its record_function block, and your source line.

    >>> import torch, eager_neuron
    >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") + 1
    >>> print(prof.timeline())  # doctest: +SKIP
    """
    items = _device_items(events)
    if not items:
        return "(no kernels)"
    head = ("core", "start_us", "dur_us", "kernel", "block", "location", "source")
    rows = [(f"neuron:{e.core}", f"{e.device_start_us:.2f}", f"{e.device_us:.2f}",
             _cut(e.name, 48), e.label or "", e.location, _cut(e.source or "", 48))
            for e in items[:limit]]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]

    def fmt(values):
        return "  ".join(v.rjust(w) if i in (1, 2) else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    if len(items) > limit:
        lines.append(f"... {len(items) - limit} more (limit={limit})")
    return "\n".join(lines)


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _color(name: str) -> str:
    """A stable colour per kernel family (the part before ':')."""
    family = name.split(":")[0]
    if family == "dma":
        return "#9e9e9e"
    h = int(hashlib.md5(family.encode()).hexdigest()[:6], 16) / 0xFFFFFF
    r, g, b = colorsys.hls_to_rgb(h, 0.55, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def html_timeline(events, title: str = "eager_neuron profile") -> str:
    """The HTML page export_timeline writes: per core, lanes of record_function blocks (one per
    nesting depth), kernels and DMA on the simulated clock; each box's tooltip names the kernel,
    its source line, start and duration.

    >>> html_timeline([]).startswith("<!DOCTYPE html>")
    True
    """
    items = _device_items(events)
    labels = [e for e in events if e.type == "label" and e.core is not None]
    cores = sorted({e.core for e in items})
    t_end = max([e.device_start_us + e.device_us for e in items] + [1e-9])
    scale = _WIDTH / t_end
    parts = []
    y = 30
    families = {}
    for core in cores:
        mine = [e for e in items if e.core == core]
        blocks = [e for e in labels if e.core == core]
        depth = max([e.depth for e in blocks] + [-1]) + 1
        parts.append(f'<text x="4" y="{y + 14}" class="core">neuron:{core}</text>')
        y += _ROW
        lanes = [(f"block {d}" if depth > 1 else "record_function", "label", d)
                 for d in range(depth)] + [("kernels", "kernel", None), ("dma", "transfer", None)]
        for lane, kind, d in lanes:
            parts.append(f'<text x="12" y="{y + 15}" class="lane">{lane}</text>')
            parts.append(f'<line x1="{_LEFT}" y1="{y + _ROW - 1}" x2="{_LEFT + _WIDTH}" '
                         f'y2="{y + _ROW - 1}" class="grid"/>')
            chosen = ([e for e in blocks if e.depth == d] if kind == "label"
                      else [e for e in mine if e.type == kind])
            for e in chosen:
                if kind == "label":
                    start, dur = e.device_start_us, e.extra["device_end_us"] - e.device_start_us
                    color = "#cfd8dc"
                    tip = (f"record_function {e.name}: {e.n_ops} kernels, {e.device_us:.2f} us "
                           f"device\n{e.location}")
                else:
                    start, dur = e.device_start_us, e.device_us
                    color = _color(e.name)
                    families.setdefault(e.name.split(":")[0], color)
                    tip = (f"{e.name}\n{e.location}\n{e.source or ''}\nstart {start:.2f} us, "
                           f"{dur:.2f} us on neuron:{core}"
                           + (f"\nblock: {e.label}" if e.label else "")
                           + (f"\nfused group {e.group} ({e.n_ops} ops)" if e.group else ""))
                x = _LEFT + start * scale
                w = max(dur * scale, 0.5)
                text = (f'<text x="{x + 2:.2f}" y="{y + 15}" class="in">'
                        f'{html.escape(_cut(e.name, int(w // 6)))}</text>' if w > 40 else "")
                parts.append(f'<g><title>{html.escape(tip)}</title><rect x="{x:.2f}" '
                             f'y="{y + 2}" width="{w:.2f}" height="{_ROW - 5}" fill="{color}"/>'
                             f'{text}</g>')
            y += _ROW
        y += 8
    # time axis
    ticks = []
    for i in range(11):
        t = t_end * i / 10
        x = _LEFT + t * scale
        ticks.append(f'<line x1="{x:.1f}" y1="20" x2="{x:.1f}" y2="{y}" class="tick"/>'
                     f'<text x="{x + 2:.1f}" y="16" class="axis">{t:.1f} us</text>')
    legend_y = y + 20
    legend = []
    for i, (fam, color) in enumerate(sorted(families.items())):
        x = _LEFT + (i % 8) * 170
        ly = legend_y + (i // 8) * 18
        legend.append(f'<rect x="{x}" y="{ly - 11}" width="12" height="12" fill="{color}"/>'
                      f'<text x="{x + 16}" y="{ly}" class="lane">{html.escape(fam)}</text>')
    height = legend_y + 18 * (len(families) // 8 + 1) + 10
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LEFT + _WIDTH + 20}" '
           f'height="{height}">' + "".join(ticks) + "".join(parts) + "".join(legend) + "</svg>")
    n_k = sum(1 for e in items if e.type == "kernel")
    style = ("body{font-family:sans-serif;margin:16px}.core{font-weight:bold;font-size:13px}"
             ".lane,.axis{font-size:11px;fill:#444}.in{font-size:10px;fill:#000;"
             "pointer-events:none}.grid{stroke:#eee}.tick{stroke:#f3f3f3}rect{stroke:#fff;"
             "stroke-width:0.3}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{style}</style></head><body><h3>{html.escape(title)}</h3>"
            f"<p>{n_k} kernels on {len(cores)} core(s), {t_end:.2f} us of simulated device "
            "time; hover a box for its kernel and your source line.</p>"
            f"{svg}</body></html>\n")
