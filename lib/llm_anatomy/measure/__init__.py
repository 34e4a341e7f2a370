"""Stage 4, notebook 07 (Prefill and decode), and the measurements every later stage uses: timing, peaks, the roofline,
overheads, memory, exactness against the reference, statistics, quality."""
