"""The `surplus` console script: thin subcommands that wire the control plane and workers."""
