"""Stage 6, notebook 09 (Making decode fast): GGUF blocks, quantization, speculative decoding, tiled attention, fusion."""
