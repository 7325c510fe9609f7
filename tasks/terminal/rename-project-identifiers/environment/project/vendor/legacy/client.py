# Vendored third-party code. DO NOT EDIT.
# Talks to the old acme_widgets server (protocol name "acme-widgets/1").
PROTOCOL = "acme-widgets/1"
SERVICE = "acme_widgets"
CLASS_NAME = "AcmeWidgets"
