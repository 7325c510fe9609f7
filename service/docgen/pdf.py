"""Render a small block model to PDF bytes with reportlab, reproducibly.

Reproducible means byte-identical for the same blocks and the same reportlab version:
reportlab's invariant mode fixes the creation date and document id, and the only font is
Bitstream Vera, which ships inside reportlab (a subset is embedded with a ToUnicode map, so
``pdftotext`` reads U+2212, €, £ and ¥ back as written). The corpus was generated with the
version in ``REPORTLAB_VERSION``; another version may lay out bytes differently while the
ground truth (computed before rendering) stays the same.

Blocks: ``Heading``, ``Para`` (reportlab paragraph markup: ``<b>``, ``<i>``, ``<super>``),
``Table`` (header rows repeat when a table splits across pages), ``Footnotes``, ``Spacer``
and ``PageBreak``. ``Doc`` adds the running header and the page footer.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

REPORTLAB_VERSION = "5.1.0"

FONT = "Vera"
FONT_BOLD = "VeraBd"
FONT_ITALIC = "VeraIt"
FONT_BOLD_ITALIC = "VeraBI"


@dataclass(frozen=True)
class Heading:
    """A heading; ``level`` 0 is a cover title, 1 a section, 2 a sub-section."""

    text: str
    level: int = 1


@dataclass(frozen=True)
class Para:
    """A paragraph; ``style`` is ``body``, ``small``, ``note`` (italic) or ``cover``."""

    text: str
    style: str = "body"


@dataclass(frozen=True)
class Table:
    """A table. ``widths`` are fractions of the text width; ``align`` one letter per column
    (``L``, ``R``, ``C``); ``bold`` and ``rule_above`` are body row indexes (0-based);
    ``header`` rows are bold, ruled below, and repeated on every page the table spans."""

    header: Sequence[Sequence[str]]
    rows: Sequence[Sequence[str]]
    widths: Sequence[float]
    align: str
    bold: frozenset[int] = frozenset()
    rule_above: frozenset[int] = frozenset()
    caption: str | None = None
    font_size: float = 8.5
    grid: bool = False


@dataclass(frozen=True)
class Footnotes:
    """Footnotes under a table or section, in a smaller type."""

    items: Sequence[str]


@dataclass(frozen=True)
class Spacer:
    """Vertical space in points."""

    height: float = 8


@dataclass(frozen=True)
class PageBreak:
    """Start a new page."""


Block = Heading | Para | Table | Footnotes | Spacer | PageBreak


@dataclass(frozen=True)
class Doc:
    """A document: ``running_header`` is printed on every page but the first, with
    ``Page N``; ``title``/``author``/``subject`` go into the PDF metadata."""

    title: str
    author: str
    running_header: str
    blocks: Sequence[Block] = field(default_factory=tuple)
    subject: str = ""


_registered = False


def _register_fonts() -> None:
    global _registered
    if _registered:
        return
    from reportlab.lib.fonts import addMapping
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    for name in (FONT, FONT_BOLD, FONT_ITALIC, FONT_BOLD_ITALIC):
        pdfmetrics.registerFont(TTFont(name, f"{name}.ttf"))
    addMapping(FONT, 0, 0, FONT)
    addMapping(FONT, 1, 0, FONT_BOLD)
    addMapping(FONT, 0, 1, FONT_ITALIC)
    addMapping(FONT, 1, 1, FONT_BOLD_ITALIC)
    _registered = True


def render(doc: Doc) -> bytes:
    """The PDF bytes of ``doc`` (A4, 20 mm margins).

    Raises ``RuntimeError`` when reportlab is missing or not ``REPORTLAB_VERSION``.
    """
    try:
        import reportlab
    except ImportError:
        raise RuntimeError(
            f"rendering the document corpus needs reportlab=={REPORTLAB_VERSION} "
            "(a development dependency: pip install -e '.[dev]')"
        ) from None
    from reportlab import rl_config
    from reportlab.lib.enums import TA_CENTER
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.lib.units import mm
    from reportlab.platypus import PageBreak as RLPageBreak
    from reportlab.platypus import Paragraph, SimpleDocTemplate
    from reportlab.platypus import Spacer as RLSpacer

    if reportlab.Version != REPORTLAB_VERSION:
        raise RuntimeError(
            f"the corpus is rendered with reportlab {REPORTLAB_VERSION}, found "
            f"{reportlab.Version}: pip install reportlab=={REPORTLAB_VERSION}"
        )
    rl_config.invariant = 1
    _register_fonts()
    styles = {
        "body": ParagraphStyle("body", fontName=FONT, fontSize=9.5, leading=13, spaceAfter=6),
        "small": ParagraphStyle("small", fontName=FONT, fontSize=8, leading=10.5, spaceAfter=3),
        "note": ParagraphStyle(
            "note", fontName=FONT_ITALIC, fontSize=8.5, leading=11, spaceAfter=4
        ),
        "cover": ParagraphStyle(
            "cover", fontName=FONT, fontSize=13, leading=18, alignment=TA_CENTER, spaceAfter=10
        ),
        "h0": ParagraphStyle(
            "h0",
            fontName=FONT_BOLD,
            fontSize=24,
            leading=30,
            alignment=TA_CENTER,
            spaceBefore=120,
            spaceAfter=24,
        ),
        "h1": ParagraphStyle(
            "h1", fontName=FONT_BOLD, fontSize=14, leading=18, spaceBefore=6, spaceAfter=8
        ),
        "h2": ParagraphStyle(
            "h2", fontName=FONT_BOLD, fontSize=11, leading=14, spaceBefore=8, spaceAfter=5
        ),
        "caption": ParagraphStyle(
            "caption", fontName=FONT_ITALIC, fontSize=8.5, leading=11, spaceAfter=3
        ),
    }
    margin = 20 * mm
    width = A4[0] - 2 * margin
    out = io.BytesIO()
    template = SimpleDocTemplate(
        out,
        pagesize=A4,
        leftMargin=margin,
        rightMargin=margin,
        topMargin=margin + 4 * mm,
        bottomMargin=margin,
        title=doc.title,
        author=doc.author,
        subject=doc.subject,
        creator="Crucible docgen",
        invariant=1,
    )

    def decorate(canvas: Any, _doc: Any) -> None:
        page = canvas.getPageNumber()
        canvas.saveState()
        canvas.setFont(FONT, 7.5)
        if page > 1:
            canvas.drawString(margin, A4[1] - margin + 2 * mm, doc.running_header)
            canvas.setLineWidth(0.4)
            canvas.line(margin, A4[1] - margin + mm, A4[0] - margin, A4[1] - margin + mm)
        canvas.drawCentredString(A4[0] / 2, margin / 2, f"Page {page}")
        canvas.restoreState()

    flow: list[Any] = []
    for block in doc.blocks:
        if isinstance(block, Heading):
            flow.append(Paragraph(block.text, styles[f"h{block.level}"]))
        elif isinstance(block, Para):
            flow.append(Paragraph(block.text, styles[block.style]))
        elif isinstance(block, Footnotes):
            flow.extend(Paragraph(item, styles["small"]) for item in block.items)
        elif isinstance(block, Spacer):
            flow.append(RLSpacer(1, block.height))
        elif isinstance(block, PageBreak):
            flow.append(RLPageBreak())
        else:
            if block.caption:
                flow.append(Paragraph(block.caption, styles["caption"]))
            flow.append(_table(block, width))
            flow.append(RLSpacer(1, 8))
    template.build(flow, onFirstPage=decorate, onLaterPages=decorate)
    return out.getvalue()


def _table(block: Table, width: float) -> Any:
    from reportlab.lib import colors
    from reportlab.platypus import Table as RLTable
    from reportlab.platypus import TableStyle

    n_header = len(block.header)
    data = [list(r) for r in block.header] + [list(r) for r in block.rows]
    table = RLTable(
        data, colWidths=[w * width for w in block.widths], repeatRows=n_header, hAlign="LEFT"
    )
    commands: list[tuple[Any, ...]] = [
        ("FONT", (0, 0), (-1, -1), FONT, block.font_size),
        ("VALIGN", (0, 0), (-1, -1), "BOTTOM"),
        ("TOPPADDING", (0, 0), (-1, -1), 1.5),
        ("BOTTOMPADDING", (0, 0), (-1, -1), 1.5),
    ]
    if n_header:
        commands += [
            ("FONT", (0, 0), (-1, n_header - 1), FONT_BOLD, block.font_size),
            ("LINEBELOW", (0, n_header - 1), (-1, n_header - 1), 0.6, colors.black),
        ]
    for col, letter in enumerate(block.align):
        where = {"L": "LEFT", "R": "RIGHT", "C": "CENTER"}[letter]
        commands.append(("ALIGN", (col, 0), (col, -1), where))
    for row in sorted(block.bold):
        commands.append(
            ("FONT", (0, n_header + row), (-1, n_header + row), FONT_BOLD, block.font_size)
        )
    for row in sorted(block.rule_above):
        commands.append(("LINEABOVE", (1, n_header + row), (-1, n_header + row), 0.5, colors.black))
    if block.grid:
        commands.append(("GRID", (0, 0), (-1, -1), 0.3, colors.grey))
    table.setStyle(TableStyle(commands))
    return table
