"""How many tokens to draft each round: the controller contract (base.py) and one module per
controller. Importing the package registers every controller in `CONTROLLERS`; `make_controller`
builds one by name."""
from .base import CONTROLLERS, PROTOCOL, Controller, make_controller
from .cycle import CycleK
from .entropy import EntropyController
from .fixed import FixedK
from .heuristic import HeuristicK

__all__ = ["CONTROLLERS", "PROTOCOL", "Controller", "CycleK", "EntropyController", "FixedK", "HeuristicK",
           "make_controller"]
