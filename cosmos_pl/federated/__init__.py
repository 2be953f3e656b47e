"""The federated round logic: stages (one Lightning Trainer each), the COSMOS loop, and the run directory."""
