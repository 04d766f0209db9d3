"""Planning: a profile, a target and a budget in, a Plan out (one scheme per layer and tensor).

See docs/layout.md. Imports nothing, so importing one module of the stage runs no other."""
