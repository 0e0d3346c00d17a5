"""Shared test setup: poison kernel outputs (NaN) so unwritten elements show."""

import os

os.environ.setdefault("FM3_POISON_OUTPUTS", "1")
