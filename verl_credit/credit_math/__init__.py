"""Pure credit math: tensors in, tensors out. No verl, no I/O, no knowledge of annotators."""
