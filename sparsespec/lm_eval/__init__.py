"""lm-eval integration: the `sparsespec` model for lm-eval (model.py), its speculation statistics
(stats.py) and lm-eval's command line with the model registered (cli.py: `python -m sparsespec.lm_eval.cli`)."""
