"""Core data structures for acme_widgets."""
from dataclasses import dataclass

ACME_WIDGETS_VERSION = "2.3.1"
USER_AGENT = "acme-widgets/" + ACME_WIDGETS_VERSION


@dataclass(frozen=True)
class Widget:
    sku: str
    price_cents: int
    qty: int = 0


class AcmeWidgets:
    """An in-memory inventory. Logger name: acme_widgets.core"""

    logger_name = "acme_widgets.core"

    def __init__(self):
        self._items = {}

    def add(self, widget):
        self._items[widget.sku] = widget
        return self

    def total_value_cents(self):
        return sum(w.price_cents * w.qty for w in self._items.values())

    def describe(self):
        return f"AcmeWidgets({len(self._items)} skus) via {USER_AGENT}"
