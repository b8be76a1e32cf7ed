"""Code generators of kiln.lower: `cpp` (one C++ translation unit of kernels per graph, for CPU) and
`wrapper` (the Python function that allocates buffers and calls kernels and externs in order).
Both read a KernelProgram from kiln.lower.schedule. Corresponds to torch/_inductor/codegen/.
"""
