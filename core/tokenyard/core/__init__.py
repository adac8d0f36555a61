"""What the tokenyard components share: API types and the CRD schema, label and
annotation keys, Kubernetes client helpers and config loading."""
