"""verl plug-in: importing this module registers the GAPO policy losses in verl's registry."""
