"""How many tokens to draft each round: the controller contract (base.py) and one module per
controller. Importing the package registers every controller in `CONTROLLERS`; `make_controller`
builds one by name."""
from sparsespec.controllers.base import CONTROLLERS, PROTOCOL, Controller, make_controller
from sparsespec.controllers.cycle import CycleK
from sparsespec.controllers.entropy import EntropyController
from sparsespec.controllers.fixed import FixedK
from sparsespec.controllers.heuristic import HeuristicK

__all__ = ["CONTROLLERS", "PROTOCOL", "Controller", "CycleK", "EntropyController", "FixedK", "HeuristicK",
           "make_controller"]
