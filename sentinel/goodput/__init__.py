"""Fleet-scale goodput simulator: replay a failure trace against a recovery model.

`trace` (what fails, how often), `model` (how recovery costs time), `youngdaly` (checkpoint
interval), `simulate` (the event loop), `levers` (what each knob buys), `report` (output).
"""
