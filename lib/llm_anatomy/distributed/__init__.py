"""Stage 7, notebook 10 (Beyond one device): tensor and pipeline parallelism on torch.distributed, and what a collective costs."""
