from acme_widgets import ACME_WIDGETS_VERSION, AcmeWidgets, Widget
from acme_widgets.acme_widgets_cli import main


def test_total_value():
    inv = AcmeWidgets().add(Widget("a", 250, 2)).add(Widget("b", 100, 3))
    assert inv.total_value_cents() == 800


def test_describe_mentions_class_and_agent():
    d = AcmeWidgets().describe()
    assert d.startswith("AcmeWidgets(0 skus)")
    assert d.endswith("acme-widgets/" + ACME_WIDGETS_VERSION)


def test_cli():
    assert main(["100", "250"]) == 350
