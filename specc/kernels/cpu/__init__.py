"""C++ kernels for the CPU, compiled on first use on the machine that runs them
(`build.py`) and called through ctypes by the operators in `specc.kernels`."""
