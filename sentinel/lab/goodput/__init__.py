"""Fleet-scale goodput simulator: replay a failure trace against a recovery model.

`trace` (what fails, how often), `model` (how recovery costs time), `paths` (which repair path
each class takes), `scaling` and `repairs` (a repair's parts at a fleet's size), `youngdaly`
(checkpoint interval), `simulate` (the event loop), `levers` (what each knob buys), `compare`
(the paths side by side at several sizes), `report` (output).
"""
