"""acme_widgets: tiny widget inventory helpers."""
from .core import ACME_WIDGETS_VERSION, AcmeWidgets, Widget

__all__ = ["AcmeWidgets", "Widget", "ACME_WIDGETS_VERSION"]
