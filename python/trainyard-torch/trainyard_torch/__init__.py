"""trainyard's libtorch build, as the trainyard-torch wheel installs it: `train` (the environment's bin/) checks
the torch installed beside it and runs `libexec/train`, which finds libtorch in `../../torch/lib`."""

import os

LIBEXEC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libexec")


def binary() -> str:
    """The path of trainyard's libtorch build in this package."""
    return os.path.join(LIBEXEC, "train")
