"""The sizes the contract allows (the gateway's tenant limits may be lower, never higher)."""

MAX_QUESTIONS = 400
MAX_CHOICES = 255
MAX_LEVELS = 10
MAX_JSON_DEPTH = 64  # arrays and objects: a structured state is a record, not a tree of a million levels
MAX_INT_DIGITS = 100
