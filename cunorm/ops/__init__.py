"""One module per op: host functions, CuPy arrays in and out (NumPy arrays run the reference)."""
