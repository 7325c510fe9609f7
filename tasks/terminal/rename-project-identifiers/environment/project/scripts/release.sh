#!/bin/sh
# Build a release of acme-widgets
set -e
VERSION=$(python3 -c 'import sys; sys.path.insert(0, "src"); import acme_widgets; print(acme_widgets.ACME_WIDGETS_VERSION)')
echo "releasing acme-widgets $VERSION"
tar czf "dist/acme_widgets-$VERSION.tar.gz" src
