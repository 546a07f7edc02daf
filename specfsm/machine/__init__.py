"""The state machine (``ServingState``) and the batch machine (``BatchState``): which
evaluation shape is legal now, for one request or B of them.
"""
