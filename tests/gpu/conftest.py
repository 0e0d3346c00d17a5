"""GPU tests: run on a CUDA machine with torch and the built paddle_fm3.kernels module; skipped elsewhere."""
import pytest

try:
    import torch
    HAVE_GPU = torch.cuda.is_available()
except Exception:  # pragma: no cover
    HAVE_GPU = False


def pytest_collection_modifyitems(config, items):
    reason = None
    if not HAVE_GPU:
        reason = "needs torch with a CUDA GPU"
    else:
        from paddle_fm3 import kernels
        if not kernels.available():
            reason = "paddle_fm3.kernels not built (scripts/gpu_build.sh && scripts/build_dlpack_ext.sh)"
    if reason:
        here = str(config.rootpath / "tests" / "gpu")
        for item in items:
            if str(item.fspath).startswith(here):
                item.add_marker(pytest.mark.skip(reason=reason))
