"""The tokenyard operator: reconciles ModelDeployments into replica groups, revisions and rollouts."""
