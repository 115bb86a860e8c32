"""``python -m pbgtrain``: the same as the ``pbgtrain`` command."""

from pbgtrain.cli import main

main()
