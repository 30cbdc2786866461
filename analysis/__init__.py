"""Analysis of sparsespec results: load run folders (or W&B runs) into one tidy DataFrame, then
draw the paper's figures and tables from it.

    python -m analysis.figures <results...> --out figures/
"""
from analysis.load import load_results, load_wandb

__all__ = ["load_results", "load_wandb"]
