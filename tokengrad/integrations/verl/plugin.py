"""verl's plugin entry point (pyproject `[project.entry-points."verl.plugins"]`): verl imports this module in
every process at `import verl` and registers tokengrad's policy losses (`tokengrad`, `tokengrad_<rule>`)
with its registry. See tokengrad.integrations.verl."""

from tokengrad.integrations.verl import register_losses

LOSSES = register_losses()
