"""`python -m sparsespec.methods [method ...]`: every method's options, defaults and reasons."""
import sys

from sparsespec.method_options import describe
from sparsespec.methods import METHODS

for name in sys.argv[1:] or sorted(METHODS):
    print(describe(name))
