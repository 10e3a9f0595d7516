"""The pass engine: a range of layers over B conversations x T positions, its KV arena, CUDA graphs, quantization, devices, memory and threads."""
