"""Running a model changed only inside a trace: the ablations, the removal variants,
residual branch scaling, the traced run layer by layer, and the self-test that a family's
spec still means what it says."""
