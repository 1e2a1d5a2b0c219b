"""The benchmarks (run each as a script: `python bench/NAME.py`)."""
