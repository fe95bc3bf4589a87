"""The GRPO objective as pure tensor math, shared by the built-in trainer and the TRL and verl integrations:
token-weighting rules (`weighting`: the registry of TR-GRPO and its neighbours), the clipped policy loss and
its aggregation (`loss`), group-relative advantages (`advantages`). Torch only: no models, no recording.
"""
