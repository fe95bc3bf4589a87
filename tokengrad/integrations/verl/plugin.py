"""verl's plugin entry point (pyproject `[project.entry-points."verl.plugins"]`): verl imports this module in
every process at `import verl` and registers tokengrad's policy losses (`tokengrad`, `tokengrad_<rule>`)
with its registry; with $TOKENGRAD_MISMATCH_PROBE_EVERY set it also installs the bypass-mode mismatch probe
(tokengrad.integrations.verl.probe, which imports verl's engine workers). See tokengrad.integrations.verl."""

from tokengrad.integrations.verl import VerlOptions, register_losses

LOSSES = register_losses()
if VerlOptions.from_env().mismatch_probe_every is not None:
    from tokengrad.integrations.verl import probe

    probe.install()
