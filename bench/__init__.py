"""runlane's benchmarks: ``python -m bench NAME [--size tiny|small|full] [--runs 3]``.

One module per figure (see BENCHMARKS.md); results go to bench/results/*.json
and plots to bench/plots/*.png.
"""
