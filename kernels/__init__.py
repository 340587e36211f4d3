"""ActFirst's fused ops (installed as ``actfirst.kernels``)."""
