"""Validation: a Plan in, its damage measured on unseen windows (and in a real engine) out.

See docs/layout.md. Imports nothing, so importing one module of the stage runs no other."""
