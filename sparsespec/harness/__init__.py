"""The Hydra harness: run.py's runner, checks, results, tracking and the sweep report."""
from sparsespec.harness.help import register_help
from sparsespec.harness.schema import register_method_options

register_method_options()   # before any config is composed (run.py, tests, the benchmark)
register_help()             # run.py --help (conf/config.yaml selects it)
