"""One self-contained HTML page: every figure embedded as a base64 PNG data URI, with its numbers as tables."""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc}
img{max-width:100%;height:auto;border:1px solid #eee}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0} th,td{padding:.2em .6em;border-bottom:1px solid #e4e4e4}
th{background:#f4f4f4;text-align:left} td{font-variant-numeric:tabular-nums}
.meta{color:#555;font-size:.9em} .note{background:#fff8e1;padding:.4em .8em;border-left:3px solid #E69F00}
details{margin:.4em 0} summary{cursor:pointer;color:#0072B2}
"""


@dataclass
class Table:
    caption: str
    frame: object  # DataFrame
    collapsed: bool = False


@dataclass
class Section:
    title: str
    text: str
    image: str  # file name of the PNG
    png: bytes
    tables: list[Table] = field(default_factory=list)
    note: str | None = None


def _fmt(x) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "–"
        if x == 0:
            return "0"
        return f"{x:.3g}" if 1e-2 <= abs(x) < 1e4 else f"{x:.2e}"
    return str(x)


def table_html(t: Table) -> str:
    df = t.frame
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
                     for row in df.itertuples(index=False))
    table = f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>"
    cap = html.escape(t.caption)
    if t.collapsed:
        return f"<details><summary>{cap} ({len(df)} rows)</summary>\n{table}\n</details>"
    return f"<p><b>{cap}</b></p>\n{table}"


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def page(title: str, meta_lines: list[str], sections: list[Section]) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        f'<head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{CSS}</style></head>',
        "<body>",
        f"<h1>{html.escape(title)}</h1>",
        '<div class="meta">' + "<br>\n".join(html.escape(m) for m in meta_lines) + "</div>",
        "<ul>" + "".join(f'<li><a href="#fig{i}">{html.escape(s.title)}</a></li>' for i, s in enumerate(sections))
        + "</ul>",
    ]
    for i, s in enumerate(sections):
        parts += [f'<section id="fig{i}">', f"<h2>{html.escape(s.title)}</h2>", f"<p>{html.escape(s.text)}</p>"]
        if s.note:
            parts.append(f'<p class="note">{html.escape(s.note)}</p>')
        parts.append(f'<img src="{data_uri(s.png)}" alt="{html.escape(s.title)}" title="{html.escape(s.image)}">')
        parts += [table_html(t) for t in s.tables]
        parts.append("</section>")
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)
