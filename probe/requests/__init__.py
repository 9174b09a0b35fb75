"""A request and what it is checked against before anything runs: the model and its
inputs, config overrides, the checks every entry point shares, the preflight of every
model of a command, and memory."""
