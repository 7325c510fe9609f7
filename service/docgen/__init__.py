"""The document corpus generator: financial documents (PDF) whose every printed figure has
a known ground truth, and the document-domain tasks built on them (``tasks/document``).

Deterministic from ``SEED`` (``service.docgen.tasks``): figures are drawn from a seeded
``random.Random`` per task, the ground truth is computed from those integers as ``Decimal``,
and only then printed (``service.docgen.fmt``) and rendered with reportlab in invariant mode
(``service.docgen.pdf``). Rendering needs reportlab (a development dependency); the
control plane never imports this package.

Regenerate with ``python -m service.docgen`` (``--check`` compares without writing).
"""

from service.docgen.tasks import SEED, build_all

__all__ = ["SEED", "build_all"]
