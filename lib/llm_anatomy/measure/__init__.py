"""Measuring on the learner's own machine: timing, the machine's peaks, the roofline, KV memory, the environment.

Everything here builds on the anatomy below it (the model, decode) and nothing here draws: the pictures
of these measurements live in llm_anatomy.views.
"""

from .peaks import Peaks, measure_bandwidth, measure_matmul_flops, measure_peaks, peaks_table, published_peaks
from .roofline import RooflinePoint, Work, forward_work, matmul_parameters, roof, roofline_point
from .timing import GenerationTiming, Timing, time_generation, time_it

__all__ = ["GenerationTiming", "Peaks", "RooflinePoint", "Timing", "Work", "forward_work", "matmul_parameters",
           "measure_bandwidth", "measure_matmul_flops", "measure_peaks", "peaks_table", "published_peaks", "roof",
           "roofline_point", "time_generation", "time_it"]
