"""``python -m flowhook``: the ``flowhook`` command (``flowhook serve`` starts its engine
process this way)."""

from flowhook.cli import main

main()
