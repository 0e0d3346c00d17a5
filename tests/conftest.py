"""Shared test setup: poison kernel outputs (NaN) so unwritten elements show; load the build package.

The build package (paddle_fm3_build/, beside setup.py) is not installed: it is imported here from the
checkout, which is on sys.path only while it loads, so that `import paddle_fm3` still finds the
installed package that the tests are about.
"""

import os
import pathlib
import sys

os.environ.setdefault("FM3_POISON_OUTPUTS", "1")

_CHECKOUT = str(pathlib.Path(__file__).resolve().parents[1])
sys.path.insert(0, _CHECKOUT)
try:
    import paddle_fm3_build.codegen  # noqa: F401
finally:
    sys.path.remove(_CHECKOUT)
