"""Profiling: a model and text in, the profile directory out (profile.csv: each layer x tensor x scheme's damage).

See docs/layout.md. Imports nothing, so importing one module of the stage runs no other."""
