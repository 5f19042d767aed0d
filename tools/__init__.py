"""Command-line tools. A package so that tests import them (``from tools import benchmark``);
each tool still runs as a script or through ``mim``."""
