"""Curating data from the policy itself (the R1 recipe around the RL stage): per-prompt pass rates,
rejection sampling of verified-correct completions into an SFT set, and pass-rate band filtering."""
