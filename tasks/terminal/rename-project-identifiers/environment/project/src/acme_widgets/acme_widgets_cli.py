"""Command line entry point: python -m acme_widgets.acme_widgets_cli"""
import os
import sys

from acme_widgets import AcmeWidgets, Widget


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    inv = AcmeWidgets()
    for i, arg in enumerate(argv):
        inv.add(Widget(sku=f"W{i}", price_cents=int(arg), qty=1))
    home = os.environ.get("ACME_WIDGETS_HOME", "~/.acme_widgets")
    print(inv.describe(), "home:", home)
    return inv.total_value_cents()


if __name__ == "__main__":
    main()
