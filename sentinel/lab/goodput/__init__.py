"""Fleet-scale goodput simulator: replay a failure trace against a recovery model.

`trace` (what fails, how often), `model` (how recovery costs time), `paths` (which repair path
each class takes), `scaling` and `repairs` (a repair's parts at a fleet's size), `youngdaly`
(checkpoint interval), `simulate` (the event loop), `decompose` (where the headline's gain comes
from, lever by lever), `levers` (what each knob buys), `compare` (the paths side by side at
several sizes), `report` (output), `drill_projection` (a drill's times decomposed, for its report).
"""
