"""The names of the two speculative sampling rules (core.sampling implements them), in a module
without torch: the settings read them."""

INVARIANT, CLASSIC = "invariant", "classic"     # drafter-invariant sampling; Leviathan et al.'s rejection sampling
SAMPLING_RULES = (INVARIANT, CLASSIC)
