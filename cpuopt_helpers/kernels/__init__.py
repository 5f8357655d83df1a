"""Hand-written training kernels from the paper's case study (the focal loss)."""
