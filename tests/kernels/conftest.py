import os

import torch

# Triton kernels run on the CPU under the interpreter (correctness only, small shapes). Must be set before the
# kernels are decorated, i.e. before actfirst.kernels is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
